"""How nvcli reaches an agent: directly, or through the API server's aggregated
API; HTTP, proxies, kubeconfig, and the rule against clear-text credentials."""
