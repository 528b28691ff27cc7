"""The replay step of ExGRPO, trainer-neutral: what one training step adds to GRPO, over rows of plain tensors."""
