"""Kubernetes side: client configuration, discovery, the reflectors, projections, leader election."""
