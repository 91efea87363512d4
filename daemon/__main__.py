"""`python3 -m daemon ...` is the `fredica` command."""

from daemon.cli import main

main()
