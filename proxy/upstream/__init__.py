"""The upstream side: the HTTP client and everything about talking to the provider."""
