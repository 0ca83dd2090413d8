//! The facts a refusal carries, in a form no layer has to dig out of prose.
//!
//! A refusal that knows something the caller does not (`IJ001`: which fields differ; `IJ002`,
//! `IJ003`: which attempt blocks, in which state; `IJ004`: the job's state and version;
//! `IJ006`: the attempt counts) ends its DETAIL with one line of facts after the sentence:
//!
//! ```text
//! DETAIL:  Attempt 62ccd04c-…-0001 (no. 1) is started and its lease runs until 2026-….
//! Facts: job_id=62ccd04c-f6e5-82dd-aeee-a9dac8090000 attempt_id=62ccd04c-f6e5-82dd-aeee-a9dac8090001 attempt_state=started
//! ```
//!
//! `key=value` pairs separated by single spaces; values never contain spaces (ids, labels,
//! numbers, comma-separated labels). A reader ignores keys it does not know, so new facts can
//! be added without breaking older clients. The extension writes the line with [`Facts::line`];
//! the client reads it with [`Facts::from_detail`].

use crate::state::{AttemptState, FingerprintField, JobState};
use crate::{format_uuid, parse_uuid};

/// What starts the facts line of a DETAIL.
pub const PREFIX: &str = "Facts: ";

/// The facts of one refusal; each is present only where the refusal has it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// The job concerned.
    pub job_id: Option<[u8; 16]>,
    /// The attempt concerned: the one in flight or unknown (`IJ002`, `IJ003`).
    pub attempt_id: Option<[u8; 16]>,
    /// The job's state (`IJ004`: the terminal state).
    pub job_state: Option<JobState>,
    /// The attempt's state as the protocol sees it (`started`, or `unknown` once its lease ran
    /// out).
    pub attempt_state: Option<AttemptState>,
    /// The fingerprint fields that differ (`IJ001`); empty when two keys derived the same id.
    pub fields: Option<Vec<FingerprintField>>,
    /// The job's version.
    pub version: Option<i64>,
    /// How many attempts the job has made (`IJ006`).
    pub attempt_count: Option<i32>,
    /// How many it may make (`IJ006`).
    pub max_attempts: Option<i32>,
}

impl Facts {
    /// The facts as the line a DETAIL ends with, or `None` when there are none.
    pub fn line(&self) -> Option<String> {
        let mut parts: Vec<String> = Vec::new();
        let mut put = |key: &str, value: Option<String>| {
            if let Some(v) = value {
                parts.push(format!("{key}={v}"));
            }
        };
        put("job_id", self.job_id.map(format_uuid));
        put("attempt_id", self.attempt_id.map(format_uuid));
        put("job_state", self.job_state.map(|s| s.to_string()));
        put("attempt_state", self.attempt_state.map(|s| s.to_string()));
        put(
            "fields",
            self.fields
                .as_ref()
                .map(|f| f.iter().map(|f| f.as_str()).collect::<Vec<_>>().join(",")),
        );
        put("version", self.version.map(|v| v.to_string()));
        put("attempt_count", self.attempt_count.map(|v| v.to_string()));
        put("max_attempts", self.max_attempts.map(|v| v.to_string()));
        (!parts.is_empty()).then(|| format!("{PREFIX}{}", parts.join(" ")))
    }

    /// The facts of a DETAIL: its last line, if that starts with [`PREFIX`]. `None` when it
    /// has none (an error pg_intent did not raise, an older extension, a refusal without facts).
    pub fn from_detail(detail: &str) -> Option<Facts> {
        let line = detail.lines().next_back()?.strip_prefix(PREFIX)?;
        let mut facts = Facts::default();
        for pair in line.split(' ') {
            let Some((key, value)) = pair.split_once('=') else {
                continue;
            };
            match key {
                "job_id" => facts.job_id = parse_uuid(value),
                "attempt_id" => facts.attempt_id = parse_uuid(value),
                "job_state" => facts.job_state = value.parse().ok(),
                "attempt_state" => facts.attempt_state = value.parse().ok(),
                "fields" => {
                    facts.fields = Some(value.split(',').filter_map(|f| f.parse().ok()).collect())
                }
                "version" => facts.version = value.parse().ok(),
                "attempt_count" => facts.attempt_count = value.parse().ok(),
                "max_attempts" => facts.max_attempts = value.parse().ok(),
                _ => {}
            }
        }
        Some(facts)
    }

    /// The human part of a DETAIL: everything but its facts line.
    pub fn prose(detail: &str) -> &str {
        if Facts::from_detail(detail).is_none() {
            return detail;
        }
        detail.rfind('\n').map_or("", |at| &detail[..at])
    }

    /// A sentence in which no line passes for a facts line (such lines are indented by a
    /// space): what the extension does to a DETAIL's sentence, which may quote text a caller
    /// chose, before it appends the real facts line.
    pub fn defuse(sentence: &str) -> String {
        let mut out = String::with_capacity(sentence.len());
        for (i, line) in sentence.split('\n').enumerate() {
            if i > 0 {
                out.push('\n');
            }
            if line.starts_with(PREFIX) {
                out.push(' ');
            }
            out.push_str(line);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_round_trip() {
        let job = crate::job_id("alice", "click-1").unwrap();
        let facts = Facts {
            job_id: Some(job),
            attempt_id: Some(crate::attempt_id(job, 2).unwrap()),
            job_state: Some(JobState::Cancelled),
            attempt_state: Some(AttemptState::Unknown),
            fields: Some(vec![FingerprintField::Provider, FingerprintField::Params]),
            version: Some(7),
            attempt_count: Some(3),
            max_attempts: Some(3),
        };
        let detail = format!("Job … is cancelled (version 7).\n{}", facts.line().unwrap());
        assert_eq!(Facts::from_detail(&detail), Some(facts.clone()));
        assert_eq!(Facts::prose(&detail), "Job … is cancelled (version 7).");
        assert_eq!(Facts::prose("no facts here"), "no facts here");
        assert_eq!(Facts::from_detail("no facts here"), None);
        assert_eq!(Facts::default().line(), None);
        let collision = Facts {
            job_id: Some(job),
            fields: Some(vec![]),
            ..Facts::default()
        };
        assert_eq!(
            Facts::from_detail(&collision.line().unwrap()),
            Some(collision.clone())
        );
        // A sentence that quotes a caller's text cannot forge facts: the extension defuses it,
        // and only the last line counts.
        let forged = format!("Reason: x\n{}", collision.line().unwrap());
        let defused = Facts::defuse(&forged);
        assert_eq!(Facts::from_detail(&defused), None);
        assert_eq!(Facts::prose(&defused), defused);
        let detail = format!("{defused}\n{}", facts.line().unwrap());
        assert_eq!(Facts::from_detail(&detail), Some(facts.clone()));
        assert_eq!(Facts::prose(&detail), defused);
        assert_eq!(Facts::from_detail("Facts: job_state=failed\nmore"), None);
        // Keys a reader does not know are skipped.
        let newer = Facts::from_detail("x\nFacts: lease=30s job_state=failed").unwrap();
        assert_eq!(newer.job_state, Some(JobState::Failed));
    }
}
