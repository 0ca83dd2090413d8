-- pg_intent 0.4.0 → 0.4.1: fixes from the review of 0.4.0 as a host database's roles would
-- meet it (docs/security.md). No table changes shape; rows are kept.
--
-- Run by ALTER EXTENSION pg_intent UPDATE. The changes:

\echo Use "ALTER EXTENSION pg_intent UPDATE TO '0.4.1'" to load this file. \quit

