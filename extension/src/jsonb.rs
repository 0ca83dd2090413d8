//! A `jsonb` value that Rust passes along without ever parsing it.
//!
//! pgrx's own `JsonB` turns every value into a `serde_json::Value` and back (jsonb → text →
//! serde → text → jsonb). The protocol never looks inside params or results: it stores them,
//! compares them with jsonb equality in SQL, and hands them back. So this type carries the
//! datum itself, and params of a megabyte cost what a pointer costs.

use pgrx::callconv::{Arg, ArgAbi, BoxRet, FcInfo};
use pgrx::datum::Datum;
use pgrx::pg_sys;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable,
};
use pgrx::{FromDatum, IntoDatum, PgMemoryContexts};

/// How deeply nested a value contract validation reads (serde_json's own limit).
pub const MAX_VALIDATED_DEPTH: usize = 128;

/// A non-NULL `jsonb` datum, possibly toasted.
#[derive(Clone, Copy, Debug)]
pub struct Jsonb(pg_sys::Datum);

impl Jsonb {
    /// The value's size once detoasted and decompressed, in bytes.
    pub fn raw_size(self) -> usize {
        // SAFETY: self.0 is a valid varlena datum (it came from PostgreSQL as jsonb).
        unsafe { pg_sys::toast_raw_datum_size(self.0) }
    }

    /// The value's bytes (its binary jsonb form, detoasted): equal bytes are the same value.
    pub fn bytes(self) -> Vec<u8> {
        // SAFETY: self.0 is a valid varlena datum; the detoasted copy (if any) is read at once.
        unsafe {
            let v = pg_sys::pg_detoast_datum_packed(self.0.cast_mut_ptr());
            pgrx::varlena::varlena_to_byte_slice(v).to_vec()
        }
    }

    /// Parses the value, for the one place that must look inside: contract validation. Fails
    /// for values nested deeper than [`MAX_VALIDATED_DEPTH`] levels: validation recurses as
    /// deep as the value, and the stack of a backend is not the place to find its end.
    pub fn to_value(self) -> Result<serde_json::Value, String> {
        // SAFETY: jsonb_out takes a jsonb datum and returns a NUL-terminated text.
        let text = unsafe {
            pgrx::fcinfo::direct_function_call::<&std::ffi::CStr>(
                pg_sys::jsonb_out,
                &[Some(self.0)],
            )
        }
        .expect("jsonb_out returns a text");
        serde_json::from_str(&text.to_string_lossy()).map_err(|e| {
            if e.to_string().contains("recursion limit") {
                format!("the value is nested deeper than {MAX_VALIDATED_DEPTH} levels")
            } else {
                e.to_string()
            }
        })
    }
}

impl FromDatum for Jsonb {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _typoid: pg_sys::Oid,
    ) -> Option<Self> {
        if is_null || datum.is_null() {
            None
        } else {
            Some(Jsonb(datum))
        }
    }

    unsafe fn from_datum_in_memory_context(
        mut memory_context: PgMemoryContexts,
        datum: pg_sys::Datum,
        is_null: bool,
        _typoid: pg_sys::Oid,
    ) -> Option<Self> {
        if is_null || datum.is_null() {
            return None;
        }
        // Values read through SPI live in SPI's memory, which is freed when SPI disconnects:
        // copy (and detoast) into the context pgrx asks for.
        unsafe {
            memory_context.switch_to(|_| {
                let copy = pg_sys::pg_detoast_datum_copy(datum.cast_mut_ptr());
                Some(Jsonb(pg_sys::Datum::from(copy)))
            })
        }
    }
}

impl IntoDatum for Jsonb {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

/// A `jsonb` read through SPI (`row.get::<CallJsonb>(n)`), copied (detoasted) into the memory of
/// the API call that reads it ([`crate::entry::caller_memory`]). SPI's own memory is freed when
/// SPI disconnects, before the call returns; pgrx's default copy goes to the transaction's
/// memory, which keeps every copy until the transaction ends.
#[derive(Clone, Copy, Debug)]
pub struct CallJsonb(pub Jsonb);

impl FromDatum for CallJsonb {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        typoid: pg_sys::Oid,
    ) -> Option<Self> {
        unsafe {
            Jsonb::from_datum_in_memory_context(
                PgMemoryContexts::For(crate::entry::caller_memory()),
                datum,
                is_null,
                typoid,
            )
        }
        .map(CallJsonb)
    }

    unsafe fn from_datum_in_memory_context(
        _memory_context: PgMemoryContexts,
        datum: pg_sys::Datum,
        is_null: bool,
        typoid: pg_sys::Oid,
    ) -> Option<Self> {
        unsafe { Self::from_polymorphic_datum(datum, is_null, typoid) }
    }
}

impl IntoDatum for CallJsonb {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        self.0.into_datum()
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

unsafe impl SqlTranslatable for Jsonb {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(Jsonb);
    const TYPE_ORIGIN: pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin =
        pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> =
        Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
}

unsafe impl<'fcx> ArgAbi<'fcx> for Jsonb {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        unsafe { arg.unbox_arg_using_from_datum() }
            .unwrap_or_else(|| panic!("argument {index} must not be null"))
    }

    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> pgrx::nullable::Nullable<Self> {
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
}

unsafe impl BoxRet for Jsonb {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> Datum<'fcx> {
        unsafe { fcinfo.return_raw_datum(self.0) }
    }
}

// SAFETY: an array element of type jsonb is a jsonb datum, valid as long as the array is.
unsafe impl pgrx::datum::UnboxDatum for Jsonb {
    type As<'src> = Jsonb;
    unsafe fn unbox<'src>(datum: pgrx::datum::Datum<'src>) -> Self::As<'src>
    where
        Self: 'src,
    {
        Jsonb(datum.sans_lifetime())
    }
}
