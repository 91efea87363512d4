"""`python3 -m daemon ...` is the `fredica` command (named so in its help and its completion)."""

from daemon.cli import main

main(prog_name="fredica")
