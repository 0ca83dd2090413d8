-- pg_intent: secure by default.
--
-- Nothing in schema intent is usable by PUBLIC. The tables are read and written only through the
-- SECURITY DEFINER functions of api.sql; an application is given exactly the calls it needs
-- (see the README, "Privileges").

REVOKE ALL ON ALL TABLES IN SCHEMA intent FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA intent FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA intent FROM PUBLIC;
