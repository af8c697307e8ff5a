"""Budgets in currency on tenants, projects and keys (docs/billing.md, "Budgets")."""
