"""The wire, shared by the server and the router: request models and the error object (protocol),
response envelopes, silence and SSE framing (responses), ASGI helpers (asgi) and the body-size /
API-key guard (guard). Imports no torch and nothing from the engine or the models, so the router
stays light."""
