"""fredica-worker: the supervisor daemon, its task store and its control surface."""
