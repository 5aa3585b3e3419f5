"""POST /v1/responses and GET /v1/responses/{id}: OpenAI's Responses API over the chat machinery."""
