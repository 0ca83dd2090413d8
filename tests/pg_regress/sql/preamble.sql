\set SHOW_CONTEXT never
SET datestyle = 'ISO, YMD';
SET timezone = 'UTC';
SET intervalstyle = 'postgres';
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_intent;
RESET client_min_messages;
