"""The worker agent: runs machines, owns their truth in a durable op log."""
