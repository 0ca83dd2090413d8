-- pg_intent: contracts and certifications (docs/protocol.md § Contracts and failover).
--
-- Providers are not interchangeable because they share an HTTP client and a JSON schema. A
-- contract says what a job's result must satisfy; a certification is recorded evidence that a
-- provider meets it, with an expiry. Failover to a provider other than the job's own needs a
-- current certification; every result of a job with a contract is validated before it can win.
-- Both tables are small reference data, read on failover and on completion.

CREATE TABLE intent.contracts (
    name           intent.short_name NOT NULL,
    output_schema  jsonb         NOT NULL,
    checker        text,
    version        integer       NOT NULL DEFAULT 1,
    created_at     timestamptz   NOT NULL DEFAULT now(),
    updated_at     timestamptz   NOT NULL DEFAULT now(),
    checker_owner  regrole,
    defined_by     regrole,

    CONSTRAINT contracts_pkey PRIMARY KEY (name),
    CONSTRAINT contracts_checker_has_owner CHECK ((checker IS NULL) = (checker_owner IS NULL)),
    CONSTRAINT contracts_schema_is_object CHECK (jsonb_typeof(output_schema) IN ('object', 'boolean')),
    CONSTRAINT contracts_version_positive CHECK (version >= 1)
);

COMMENT ON TABLE intent.contracts IS
    'What a job''s result must satisfy: a JSON Schema (draft 2020-12) for its shape and, optionally, a SQL checker (jsonb) -> boolean for what business logic must be able to interpret.';
COMMENT ON COLUMN intent.contracts.name IS 'The name jobs refer to in intent.jobs.contract.';
COMMENT ON COLUMN intent.contracts.output_schema IS 'JSON Schema (draft 2020-12) every result must validate against.';
COMMENT ON COLUMN intent.contracts.checker IS
    'Optional STABLE or IMMUTABLE function (jsonb) -> boolean run after the schema; anything but true (false, NULL, an error) rejects the result. Stored by its identity (schema-qualified name and argument types, as pg_identify_object gives it), which pg_upgrade keeps; renaming it detaches it.';
COMMENT ON COLUMN intent.contracts.version IS
    'Bumped whenever the schema or the checker changes. Certifications count only for the version they were earned on.';
COMMENT ON COLUMN intent.contracts.created_at IS 'When the contract was first defined.';
COMMENT ON COLUMN intent.contracts.updated_at IS 'When the schema or checker last changed.';
COMMENT ON COLUMN intent.contracts.checker_owner IS
    'The role that owned the checker when the contract was defined; the checker runs as it. A result is rejected if the checker has changed owner since: redefine the contract.';
COMMENT ON COLUMN intent.contracts.defined_by IS
    'The role that defined the contract (NULL: before 0.2.0). It had EXECUTE on the checker and the rights of its owner; a result is rejected once it no longer has them.';

CREATE TABLE intent.certifications (
    id                bigint       GENERATED ALWAYS AS IDENTITY,
    provider          intent.short_name NOT NULL,
    contract          intent.short_name NOT NULL,
    contract_version  integer      NOT NULL,
    evidence          jsonb        NOT NULL,
    certified_at      timestamptz  NOT NULL DEFAULT statement_timestamp(),
    expires_at        timestamptz  NOT NULL,
    revoked_at        timestamptz,
    revoked_reason    text,

    CONSTRAINT certifications_pkey PRIMARY KEY (id),
    CONSTRAINT certifications_contract_fkey FOREIGN KEY (contract) REFERENCES intent.contracts (name),
    CONSTRAINT certifications_expires_after_certified CHECK (expires_at > certified_at),
    CONSTRAINT certifications_revocation_has_reason CHECK ((revoked_at IS NULL) = (revoked_reason IS NULL))
);

-- The newest certification of a provider for a contract is the one that counts.
CREATE INDEX certifications_provider_contract ON intent.certifications (provider, contract, id DESC);

COMMENT ON TABLE intent.certifications IS
    'Recorded evidence that a provider passed a contract''s tests. History is kept: the newest row for (provider, contract) decides, and it is current while not revoked, not expired and earned on the contract''s current version.';
COMMENT ON COLUMN intent.certifications.id IS 'Orders certifications; the highest id for (provider, contract) is the one that counts.';
COMMENT ON COLUMN intent.certifications.provider IS 'The certified provider.';
COMMENT ON COLUMN intent.certifications.contract IS 'The contract it was certified for.';
COMMENT ON COLUMN intent.certifications.contract_version IS 'The contract version the evidence was earned on; a redefined contract needs new evidence.';
COMMENT ON COLUMN intent.certifications.evidence IS 'The contract-test results: inputs, pass/fail per case, provider settings.';
COMMENT ON COLUMN intent.certifications.certified_at IS 'When the certification was recorded.';
COMMENT ON COLUMN intent.certifications.expires_at IS 'After this, failover to the provider is refused until it is certified again.';
COMMENT ON COLUMN intent.certifications.revoked_at IS 'When revoke_certification withdrew it (NULL: not revoked).';
COMMENT ON COLUMN intent.certifications.revoked_reason IS 'Why it was revoked.';
COMMENT ON INDEX intent.certifications_provider_contract IS 'Finds the certification that counts for a failover.';

COMMENT ON CONSTRAINT contracts_pkey ON intent.contracts IS 'One contract per name.';
COMMENT ON CONSTRAINT contracts_schema_is_object ON intent.contracts IS 'A JSON Schema is an object or a boolean.';
COMMENT ON CONSTRAINT contracts_version_positive ON intent.contracts IS 'Versions start at 1.';
COMMENT ON CONSTRAINT contracts_checker_has_owner ON intent.contracts IS 'A checker is recorded with the role it runs as.';
COMMENT ON CONSTRAINT certifications_pkey ON intent.certifications IS 'Orders certifications; the newest of a pair counts.';
COMMENT ON CONSTRAINT certifications_contract_fkey ON intent.certifications IS 'A certification is for a defined contract.';
COMMENT ON CONSTRAINT certifications_expires_after_certified ON intent.certifications IS 'A certification expires after it is recorded.';
COMMENT ON CONSTRAINT certifications_revocation_has_reason ON intent.certifications IS 'A revocation always says why.';
COMMENT ON INDEX intent.contracts_pkey IS 'Finds a contract by name.';
COMMENT ON INDEX intent.certifications_pkey IS 'Finds a certification by id.';

ALTER TABLE intent.jobs
    ADD CONSTRAINT jobs_contract_fkey FOREIGN KEY (contract) REFERENCES intent.contracts (name);
COMMENT ON CONSTRAINT jobs_contract_fkey ON intent.jobs IS
    'A job names a defined contract, and a contract in use cannot be dropped.';

SELECT pg_catalog.pg_extension_config_dump('intent.contracts', '');
SELECT pg_catalog.pg_extension_config_dump('intent.certifications', '');
SELECT pg_catalog.pg_extension_config_dump('intent.certifications_id_seq', '');
