"""draudit: compliance audit collector for GPU allocations on Kubernetes (DRA, resource.k8s.io/v1)."""

__version__ = "0.1.0"
