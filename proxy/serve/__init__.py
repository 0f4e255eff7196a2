"""The process edge: the uvicorn server, workers, shutdown, client limits and the demo."""
