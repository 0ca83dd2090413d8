-- Mutation for tests/crash.rs: the protocol's tables skip the write-ahead log, so a crash
-- empties them. Every acknowledged job, attempt and win is then gone after the restart.
ALTER TABLE intent.attempts SET UNLOGGED;
ALTER TABLE intent.events SET UNLOGGED;
ALTER TABLE intent.jobs SET UNLOGGED;
