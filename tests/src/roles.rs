//! Test support for privileges and owner isolation: login roles made for one test, connections
//! as those roles (the test clusters trust every local login), with the server's notices
//! (WARNINGs) kept, and the statements that list every object of schema `intent`.

use crate::{Client, Db, SqlError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio_postgres::{AsyncMessage, NoTls};

static ROLE_SEQ: AtomicUsize = AtomicUsize::new(0);

/// Creates a login role with a name unique to this process (roles are cluster-wide, and the
/// tests of one binary share a cluster). `options` follow `CREATE ROLE … LOGIN`, e.g.
/// `"IN ROLE intent_app"`. Returns the role's name.
pub async fn create_login_role(admin: &Client, prefix: &str, options: &str) -> String {
    let name = format!(
        "{prefix}_{}_{}",
        std::process::id(),
        ROLE_SEQ.fetch_add(1, Ordering::Relaxed)
    );
    admin
        .batch_execute(&format!("CREATE ROLE \"{name}\" LOGIN {options}"))
        .await
        .unwrap_or_else(|e| panic!("CREATE ROLE {name}: {:?}", SqlError::from_error(&e)));
    name
}

/// Runs a set-up script one statement at a time, each its own transaction. A script sent
/// whole (`batch_execute`) is one transaction, and on Citus a schema created in it is not yet on
/// the workers when a later statement of it, run as another role (`SET ROLE`), creates an
/// object there over a connection of that role's: "schema … does not exist".
pub async fn run_each(c: &Client, script: &str) {
    for statement in statements(script) {
        c.batch_execute(&statement)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {:?}", SqlError::from_error(&e)));
    }
}

/// A script's statements: split at each `;` outside quotes, quoted identifiers, comments and
/// dollar-quoted bodies.
pub fn statements(script: &str) -> Vec<String> {
    let b = script.as_bytes();
    let (mut out, mut start, mut i) = (Vec::new(), 0, 0);
    while i < b.len() {
        match b[i] {
            b'\'' | b'"' => {
                let q = b[i];
                i += 1;
                while i < b.len() && b[i] != q {
                    i += 1;
                }
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'$' => {
                let tag_end = b[i + 1..]
                    .iter()
                    .position(|&c| !(c.is_ascii_alphanumeric() || c == b'_'))
                    .map(|p| i + 1 + p);
                if let Some(e) = tag_end.filter(|&e| b[e] == b'$') {
                    let tag = &script[i..=e];
                    let body = e + 1;
                    i = script[body..]
                        .find(tag)
                        .map_or(b.len(), |p| body + p + tag.len() - 1);
                }
            }
            b';' => {
                let s = script[start..i].trim();
                if !s.is_empty() {
                    out.push(s.to_string());
                }
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    let s = script[start..].trim();
    if !s.is_empty() {
        out.push(s.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn statements_split_outside_quotes_and_bodies() {
        assert_eq!(
            super::statements(
                "CREATE SCHEMA \"a;b\"; SELECT ';' -- x;y\n; CREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$;
                 CREATE FUNCTION g() RETURNS int AS $q$ SELECT $$; $q$ LANGUAGE sql"
            ),
            [
                "CREATE SCHEMA \"a;b\"",
                "SELECT ';' -- x;y",
                "CREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$",
                "CREATE FUNCTION g() RETURNS int AS $q$ SELECT $$; $q$ LANGUAGE sql",
            ]
        );
    }
}

/// The notices (WARNING, NOTICE, …) a connection received, as "SEVERITY: message".
#[derive(Debug, Clone, Default)]
pub struct Notices(Arc<Mutex<Vec<String>>>);

impl Notices {
    /// Everything received so far.
    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// Forgets what was received so far.
    pub fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

/// Connects to `db` as `role`, with `options` sent in the startup packet (like `PGOPTIONS`,
/// e.g. `-c search_path=public`) when given. Keeps the notices the server sends.
pub async fn connect_role_with(
    db: &Db<'_>,
    role: &str,
    options: Option<&str>,
) -> Result<(Client, Notices), tokio_postgres::Error> {
    let mut config = db.cluster.config(&db.name);
    config.user(role).application_name("pg_intent_security");
    if let Some(options) = options {
        config.options(options);
    }
    let (client, mut connection) = config.connect(NoTls).await?;
    let notices = Notices::default();
    let sink = notices.clone();
    tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notice(n)) => {
                    sink.0
                        .lock()
                        .unwrap()
                        .push(format!("{}: {}", n.severity(), n.message()))
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    Ok((client, notices))
}

/// Connects to `db` as `role` (panics if it cannot).
pub async fn connect_role(db: &Db<'_>, role: &str) -> Client {
    connect_role_with(db, role, None)
        .await
        .unwrap_or_else(|e| panic!("connect as {role}: {e:?}"))
        .0
}

/// Runs a statement and returns its SQLSTATE, or `None` when it succeeded.
pub async fn sqlstate_of(c: &Client, sql: &str) -> Option<String> {
    match c.batch_execute(sql).await {
        Ok(()) => None,
        Err(e) => Some(
            SqlError::code_of(&e).unwrap_or_else(|| panic!("{sql}: not a server error: {e:?}")),
        ),
    }
}

/// One function of schema `intent`, as the catalog describes it.
#[derive(Debug, Clone)]
pub struct IntentFunction {
    /// `intent.name(argtypes)`, as `regprocedure` prints it.
    pub signature: String,
    /// The bare name.
    pub name: String,
    /// A statement calling it with NULL for every argument (None for trigger functions, which
    /// cannot be called directly).
    pub call: Option<String>,
    pub security_definer: bool,
    pub language: String,
    pub config: Option<Vec<String>>,
    pub owner: String,
}

/// Every function of schema `intent` (read as a superuser).
pub async fn intent_functions(admin: &Client) -> Vec<IntentFunction> {
    admin
        .query(
            "SELECT p.oid::regprocedure::text,
                    p.proname::text,
                    CASE WHEN p.prorettype IN ('pg_catalog.trigger'::regtype,
                                               'pg_catalog.event_trigger'::regtype) THEN NULL
                         ELSE format('SELECT %s(%s)', p.oid::regproc,
                                     (SELECT string_agg('NULL::' || format_type(t, NULL), ', ' ORDER BY n)
                                        FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, n)))
                    END,
                    p.prosecdef,
                    l.lanname::text,
                    p.proconfig,
                    pg_get_userbyid(p.proowner)::text
               FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
              WHERE p.pronamespace = 'intent'::regnamespace
              ORDER BY 1",
            &[],
        )
        .await
        .expect("list intent functions")
        .iter()
        .map(|r| IntentFunction {
            signature: r.get(0),
            name: r.get(1),
            call: r.get(2),
            security_definer: r.get(3),
            language: r.get(4),
            config: r.get(5),
            owner: r.get(6),
        })
        .collect()
}

/// One relation (table, view, sequence) of schema `intent`.
#[derive(Debug, Clone)]
pub struct IntentRelation {
    /// `intent.name`.
    pub name: String,
    /// `r` table, `v` view, `S` sequence.
    pub kind: String,
    /// The first ordinary column (not an identity), to write an UPDATE that changes nothing.
    pub first_column: Option<String>,
    pub owner: String,
}

/// Every table, view and sequence of schema `intent` (read as a superuser).
pub async fn intent_relations(admin: &Client) -> Vec<IntentRelation> {
    admin
        .query(
            "SELECT c.oid::regclass::text, c.relkind::text,
                    (SELECT quote_ident(attname) FROM pg_attribute
                      WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped
                        AND attidentity = '' AND attgenerated = ''
                      ORDER BY attnum LIMIT 1),
                    pg_get_userbyid(c.relowner)::text
               FROM pg_class c
              WHERE c.relnamespace = 'intent'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
              ORDER BY 1",
            &[],
        )
        .await
        .expect("list intent relations")
        .iter()
        .map(|r| IntentRelation {
            name: r.get(0),
            kind: r.get(1),
            first_column: r.get(2),
            owner: r.get(3),
        })
        .collect()
}
