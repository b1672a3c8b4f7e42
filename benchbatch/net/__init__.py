"""HTTP, with aiohttp: the OpenAI-compatible streaming client that serve-sweep --endpoint
drives (endpoint.py: the URL, the key, a request's body; discovery.py: what the server
says about itself; client.py: the run's requests streamed; prompts.py), and the server
that puts benchbatch's own engine behind the same API (server.py). Below output and
experiments, above runtime: the client needs only core, the server the engine."""
