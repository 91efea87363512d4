"""The store's PostgreSQL backend (SPEC §16): `connection` (the connection the repositories
expect, over psycopg 3), `migrations` (the same schema versions as SQLite's), `claim` (claiming
with `FOR UPDATE SKIP LOCKED`). Only `connection` imports psycopg: nothing here loads it."""
