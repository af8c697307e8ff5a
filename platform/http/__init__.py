"""HTTP transport concerns that hold for every route, whatever the domain: the ASGI guards that
bound what a client can send (``head_deadline``: the request head; ``body_guard``: the body's size
and time; ``text_guard``: text that cannot be stored), the request id every response carries
(``request_id``), how errors leave the server as OpenAI-style bodies (``error_handlers``; the
domain errors themselves are ``platform/errors.py``, raised by services that know nothing of
HTTP) and how they are documented in /openapi.json (``openapi_errors``), and the access log
(``access_log``). Nothing here imports a domain package (an import-linter contract)."""
