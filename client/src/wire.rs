//! The values the calls send and read that are not plain SQL types: JSON documents serialized
//! before the call, JSON read back undecoded, and durations as `interval`s.

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};

use crate::error::Error;

/// A JSON document serialized before the call, sent as `jsonb` (or `json`).
#[derive(Debug)]
pub(crate) struct JsonArg(Vec<u8>);

impl JsonArg {
    pub(crate) fn new<T: Serialize + ?Sized>(value: &T) -> Result<Self, Error> {
        let mut buf = Vec::with_capacity(128);
        serde_json::to_writer(&mut buf, value).map_err(Error::Serialize)?;
        Ok(JsonArg(buf))
    }
}

impl ToSql for JsonArg {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        if *ty == Type::JSONB {
            out.put_u8(1); // jsonb binary format version
        }
        out.extend_from_slice(&self.0);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }

    to_sql_checked!();
}

/// A JSON document as received, decoded by the caller into its own type.
pub(crate) struct RawJson<'a>(pub(crate) &'a [u8]);

impl<'a> FromSql<'a> for RawJson<'a> {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        if *ty == Type::JSONB {
            match raw.split_first() {
                Some((1, rest)) => Ok(RawJson(rest)),
                _ => Err("unsupported jsonb binary format version".into()),
            }
        } else {
            Ok(RawJson(raw))
        }
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }
}

impl RawJson<'_> {
    pub(crate) fn decode<R: DeserializeOwned>(&self) -> Result<R, Error> {
        serde_json::from_slice(self.0).map_err(Error::Deserialize)
    }
}

/// A [`Duration`] sent as an `interval` of microseconds (rounded up, so that a positive
/// duration never becomes a zero interval; saturating, so that the server's range check
/// refuses an absurd one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct IntervalArg(i64);

impl IntervalArg {
    pub(crate) fn new(d: Duration) -> Self {
        let micros = d.as_nanos().div_ceil(1_000);
        IntervalArg(i64::try_from(micros).unwrap_or(i64::MAX))
    }
}

impl ToSql for IntervalArg {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.put_i64(self.0); // microseconds
        out.put_i32(0); // days
        out.put_i32(0); // months
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::INTERVAL
    }

    to_sql_checked!();
}

/// An `interval` read back as a [`Duration`] (a month counts 30 days; negative is zero).
pub(crate) struct IntervalValue(pub(crate) Duration);

impl<'a> FromSql<'a> for IntervalValue {
    fn from_sql(
        _ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let raw: [u8; 16] = raw.try_into().map_err(|_| "interval must be 16 bytes")?;
        let micros = i64::from_be_bytes(raw[0..8].try_into().expect("8 bytes"));
        let days = i32::from_be_bytes(raw[8..12].try_into().expect("4 bytes"));
        let months = i32::from_be_bytes(raw[12..16].try_into().expect("4 bytes"));
        let total =
            i128::from(micros) + (i128::from(days) + 30 * i128::from(months)) * 86_400_000_000;
        let total = u64::try_from(total.max(0)).unwrap_or(u64::MAX);
        Ok(IntervalValue(Duration::from_micros(total)))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::INTERVAL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_encoding_never_rounds_to_zero() {
        assert_eq!(IntervalArg::new(Duration::from_nanos(1)).0, 1);
        assert_eq!(IntervalArg::new(Duration::from_millis(300)).0, 300_000);
        assert_eq!(IntervalArg::new(Duration::ZERO).0, 0);
        assert_eq!(IntervalArg::new(Duration::MAX).0, i64::MAX);
    }

    #[test]
    fn interval_decoding() {
        let mut raw = Vec::new();
        raw.extend_from_slice(&1_500_000i64.to_be_bytes());
        raw.extend_from_slice(&1i32.to_be_bytes());
        raw.extend_from_slice(&0i32.to_be_bytes());
        let d = IntervalValue::from_sql(&Type::INTERVAL, &raw).unwrap().0;
        assert_eq!(d, Duration::from_micros(86_400_000_000 + 1_500_000));
    }
}
