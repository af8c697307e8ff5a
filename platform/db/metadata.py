"""Import every model module so ``Base.metadata`` describes the whole schema (Alembic reads this)."""

from loraplex.platform.adapters import models as _adapters  # noqa: F401
from loraplex.platform.admin.sso import models as _admin_sessions  # noqa: F401
from loraplex.platform.alerts import models as _alerts  # noqa: F401
from loraplex.platform.audit import models as _audit  # noqa: F401
from loraplex.platform.budgets import models as _budgets  # noqa: F401
from loraplex.platform.db.base import Base
from loraplex.platform.inference.responses_api import store as _responses  # noqa: F401
from loraplex.platform.keys import models as _keys  # noqa: F401
from loraplex.platform.pricing import models as _pricing  # noqa: F401
from loraplex.platform.projects import models as _projects  # noqa: F401
from loraplex.platform.quotas import models as _quotas  # noqa: F401
from loraplex.platform.tenants import models as _tenants  # noqa: F401
from loraplex.platform.usage import models as _usage  # noqa: F401

metadata = Base.metadata
