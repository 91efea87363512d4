"""The HTTP API, the web page and /metrics (SPEC §17), served from inside the daemon when
`[http] listen` is set.

- `server`: the thread and event loop that serve, started and stopped with the daemon;
- `auth`: the bearer token (its file) and the checks every request passes (token, no CORS);
- `api`: every control-socket operation under `/api/v1/<op>`, through the same handlers;
- `events`: the one producer of live task changes, fanned out as server-sent events;
- `metrics`: the Prometheus collector, read at scrape time;
- `page/`: the page itself (HTML, CSS, JavaScript; no build step, no third-party assets).
"""
