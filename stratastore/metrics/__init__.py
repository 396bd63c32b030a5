"""What a store tells an operator: the monitor file and the Prometheus text."""
