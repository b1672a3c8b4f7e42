"""HTTP, with aiohttp: the OpenAI-compatible streaming client that serve-sweep --endpoint
drives (client.py, prompts.py), and the server that puts benchbatch's own engine behind
the same API (server.py). Below output and experiments, above runtime: the client needs
only core, the server the engine."""
