"""vLLM as the gateway's engine: the backend, its in-process or remote replicas, discovery."""
