"""Train / evaluate / predict loops shared by every task, metrics and checkpoints."""
