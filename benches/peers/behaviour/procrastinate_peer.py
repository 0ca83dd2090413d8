"""The procrastinate app the peers run uses: the CLI's `--app=procrastinate_peer.app` for
`procrastinate schema --apply`, and the behaviour runs (procrastinate_behaviour.py)."""

import os

import procrastinate

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ["PEERS_DSN"]))
