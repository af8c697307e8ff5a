"""Money: the price book (prices per million tokens, by model, with history), spend computed from
the usage ledger at read time, and the OpenAI-shaped usage / costs endpoints tenants read."""
