"""OpenAI's Responses API (``/v1/responses``) on top of the chat path: a request becomes a chat
request (same admission, billing, tools and structured output), its answer becomes a Response
object or the Responses stream events, and stored responses live per tenant in the database."""
