"""Public ops with flash-linear-attention's signatures."""
