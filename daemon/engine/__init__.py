"""The supervisor's engine: attempts and their phases, and the executor processes that run them."""
