"""PostgreSQL runs of the peers workloads, rescue and claim, fredica beside procrastinate (issue 15)."""
