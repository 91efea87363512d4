"""The task store: the only code that writes SQL.

Everything above this package (scheduler, supervisor, control socket, CLI) speaks to the database
through the repository functions in `tasks` and `runs`, so a second backend can be added here alone.
"""
