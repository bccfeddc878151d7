//! Plugin fields. One table ([`FIELDS`]) drives parsing, validation, serialization and the
//! creator's field list, so a field is added in one place.
//!
//! Absent fields mean Edge-LLM 0.11's behaviour (plain all-reduce, strategy AUTO), so engines
//! serialized by Edge-LLM (which carry only `tp_size`) deserialize unchanged. Only `tp_size` and
//! the fields that differ from their defaults are serialized, so an engine built with default
//! settings stays loadable by Edge-LLM's own plugin.

use crate::error::{Error, Result};

/// TensorRT `PluginFieldType` codes this plugin reads or writes.
pub(crate) mod field_type {
    pub(crate) const FLOAT32: i32 = 1;
    pub(crate) const FLOAT64: i32 = 2;
    pub(crate) const INT32: i32 = 5;
    pub(crate) const INT64: i32 = 10;
}

/// The seed's `AllReduceStrategyType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Nccl = 0,
    OneShot = 1,
    TwoShot = 2,
    Auto = 3,
}

/// The seed's `AllReduceFusionOp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusionOp {
    None = 0,
    ResidualRmsNorm = 1,
}

/// Bits of the seed's `AllReduceStrategyConfig`.
pub(crate) mod config_bits {
    pub(crate) const USE_MEMCPY: i32 = 1;
    pub(crate) const RESIDUAL_RMS_NORM: i32 = 2;
    pub(crate) const ALL: i32 = USE_MEMCPY | RESIDUAL_RMS_NORM;
}

/// Everything a plugin instance is configured with; what its fields describe.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginConfig {
    pub tp_size: i32,
    pub strategy: Strategy,
    pub config: i32,
    pub fusion_op: FusionOp,
    pub eps: f32,
    /// The fused op takes a bias input (x, residual, gamma, bias).
    pub has_bias: bool,
}

impl PluginConfig {
    /// Edge-LLM's plugin: only `tp_size` given, every other field at its default.
    pub fn with_tp_size(tp_size: i32) -> Result<Self> {
        let mut config = Self::defaults();
        let spec = FIELDS.iter().find(|s| s.name == "tp_size").expect("tp_size is in the table");
        (spec.set)(&mut config, check(spec, Value::Int(tp_size as i64))?);
        Ok(config)
    }

    fn defaults() -> Self {
        PluginConfig {
            tp_size: 0,
            strategy: Strategy::Auto,
            config: 0,
            fusion_op: FusionOp::None,
            eps: 1e-6,
            has_bias: false,
        }
    }

    /// Whether the fused residual + RMSNorm interface is asked for (either spelling of the seed).
    pub fn fuses_residual_rms_norm(&self) -> bool {
        self.fusion_op == FusionOp::ResidualRmsNorm || self.config & config_bits::RESIDUAL_RMS_NORM != 0
    }
}

/// A field's value as decoded from TensorRT's bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Value {
    Int(i64),
    Float(f64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Int32,
    Float32,
}

struct FieldSpec {
    name: &'static str,
    kind: Kind,
    required: bool,
    /// The valid values, inclusive (integers for `Kind::Int32`).
    range: (f64, f64),
    /// What a value outside `range` means, for the error.
    meaning: &'static str,
    get: fn(&PluginConfig) -> Value,
    /// Stores a value already checked against `kind` and `range`.
    set: fn(&mut PluginConfig, Value),
}

fn int(v: Value) -> i64 {
    match v {
        Value::Int(x) => x,
        Value::Float(x) => x as i64,
    }
}

const FIELDS: &[FieldSpec] = &[
    FieldSpec {
        name: "tp_size",
        kind: Kind::Int32,
        required: true,
        range: (1.0, i32::MAX as f64),
        meaning: "the tensor-parallel size",
        get: |c| Value::Int(c.tp_size as i64),
        set: |c, v| c.tp_size = int(v) as i32,
    },
    FieldSpec {
        name: "strategy",
        kind: Kind::Int32,
        required: false,
        range: (0.0, 3.0),
        meaning: "NCCL=0, ONESHOT=1, TWOSHOT=2, AUTO=3",
        get: |c| Value::Int(c.strategy as i64),
        set: |c, v| {
            c.strategy = [Strategy::Nccl, Strategy::OneShot, Strategy::TwoShot, Strategy::Auto][int(v) as usize]
        },
    },
    FieldSpec {
        name: "config",
        kind: Kind::Int32,
        required: false,
        range: (0.0, config_bits::ALL as f64),
        meaning: "bits USE_MEMCPY=1 | RESIDUAL_RMS_NORM=2",
        get: |c| Value::Int(c.config as i64),
        set: |c, v| c.config = int(v) as i32,
    },
    FieldSpec {
        name: "fusion_op",
        kind: Kind::Int32,
        required: false,
        range: (0.0, 1.0),
        meaning: "NONE=0, RESIDUAL_RMS_NORM=1",
        get: |c| Value::Int(c.fusion_op as i64),
        set: |c, v| c.fusion_op = if int(v) == 1 { FusionOp::ResidualRmsNorm } else { FusionOp::None },
    },
    FieldSpec {
        name: "eps",
        kind: Kind::Float32,
        required: false,
        range: (0.0, f32::MAX as f64),
        meaning: "a finite number >= 0",
        get: |c| Value::Float(c.eps as f64),
        set: |c, v| {
            if let Value::Float(x) = v {
                c.eps = x as f32
            }
        },
    },
    FieldSpec {
        name: "has_bias",
        kind: Kind::Int32,
        required: false,
        range: (0.0, 1.0),
        meaning: "0 or 1",
        get: |c| Value::Int(c.has_bias as i64),
        set: |c, v| c.has_bias = int(v) == 1,
    },
];

/// Checks a decoded value against the spec's range (NaN is never in range).
fn check(spec: &FieldSpec, v: Value) -> Result<Value> {
    let (lo, hi) = spec.range;
    let x = match v {
        Value::Int(x) => x as f64,
        Value::Float(x) => x,
    };
    if (lo..=hi).contains(&x) {
        Ok(v)
    } else {
        Err(Error::field(spec.name, format!("{v:?} is out of range [{lo}, {hi}] ({})", spec.meaning)))
    }
}

/// One field as TensorRT hands it over: name, `PluginFieldType`, element count, raw bytes.
#[derive(Clone, Debug)]
pub struct IncomingField<'a> {
    pub name: &'a str,
    pub field_type: i32,
    pub length: i32,
    /// `length` elements of `field_type`; empty when the type is one this plugin never reads.
    pub bytes: &'a [u8],
}

/// Bytes per element of the field types this plugin reads (others are rejected by name).
pub(crate) fn element_size(field_type: i32) -> Option<usize> {
    match field_type {
        field_type::INT32 | field_type::FLOAT32 => Some(4),
        field_type::INT64 | field_type::FLOAT64 => Some(8),
        _ => None,
    }
}

fn decode(spec: &FieldSpec, f: &IncomingField) -> Result<Value> {
    if f.length != 1 {
        return Err(Error::field(spec.name, format!("expects exactly 1 element, got length {}", f.length)));
    }
    let want = element_size(f.field_type).unwrap_or(usize::MAX);
    if f.bytes.len() != want {
        return Err(Error::field(spec.name, format!("has no data or an unsupported PluginFieldType {}", f.field_type)));
    }
    let b = f.bytes;
    let value = match (spec.kind, f.field_type) {
        (Kind::Int32, field_type::INT32) => Value::Int(i32::from_ne_bytes(b.try_into().unwrap()) as i64),
        (Kind::Int32, field_type::INT64) => Value::Int(i64::from_ne_bytes(b.try_into().unwrap())),
        (Kind::Float32, field_type::FLOAT32) => Value::Float(f32::from_ne_bytes(b.try_into().unwrap()) as f64),
        (Kind::Float32, field_type::FLOAT64) => Value::Float(f64::from_ne_bytes(b.try_into().unwrap())),
        (Kind::Int32, t) => {
            return Err(Error::field(spec.name, format!("must be kINT32 (PluginFieldType 5), got type {t}")))
        }
        (Kind::Float32, t) => {
            return Err(Error::field(spec.name, format!("must be kFLOAT32 (PluginFieldType 1), got type {t}")))
        }
    };
    Ok(value)
}

/// Parses and validates a field collection. Unknown names, duplicates, wrong types or lengths and
/// out-of-range values are errors; absent optional fields take their defaults.
pub(crate) fn parse(fields: &[IncomingField]) -> Result<PluginConfig> {
    let mut config = PluginConfig::defaults();
    let mut seen = [false; FIELDS.len()];
    for f in fields {
        let Some(index) = FIELDS.iter().position(|s| s.name == f.name) else {
            let known: Vec<_> = FIELDS.iter().map(|s| s.name).collect();
            return Err(Error::UnknownField(f.name.to_owned(), known.join(", ")));
        };
        if std::mem::replace(&mut seen[index], true) {
            return Err(Error::field(f.name, "is given more than once"));
        }
        let spec = &FIELDS[index];
        (spec.set)(&mut config, check(spec, decode(spec, f)?)?);
    }
    if let Some(missing) = FIELDS.iter().zip(seen).find(|(s, seen)| s.required && !seen) {
        return Err(Error::MissingField(missing.0.name));
    }
    Ok(config)
}

/// A field as written by `getFieldsToSerialize` (or listed by the creator, with empty `bytes`).
#[derive(Clone, Debug, PartialEq)]
pub struct OutgoingField {
    pub name: &'static str,
    pub field_type: i32,
    pub bytes: Vec<u8>,
}

fn encode(spec: &FieldSpec, value: Value) -> OutgoingField {
    let (field_type, bytes) = match value {
        Value::Int(x) => (field_type::INT32, (x as i32).to_ne_bytes().to_vec()),
        Value::Float(x) => (field_type::FLOAT32, (x as f32).to_ne_bytes().to_vec()),
    };
    OutgoingField { name: spec.name, field_type, bytes }
}

/// `tp_size`, then every field whose value differs from its default.
pub(crate) fn serialize(config: &PluginConfig) -> Vec<OutgoingField> {
    let defaults = PluginConfig::defaults();
    FIELDS
        .iter()
        .filter(|s| s.required || (s.get)(config) != (s.get)(&defaults))
        .map(|s| encode(s, (s.get)(config)))
        .collect()
}

/// Every field the creator accepts, with its type, for `getFieldNames`.
pub(crate) fn declared() -> Vec<OutgoingField> {
    FIELDS
        .iter()
        .map(|s| OutgoingField {
            name: s.name,
            field_type: if s.kind == Kind::Int32 { field_type::INT32 } else { field_type::FLOAT32 },
            bytes: Vec::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(name: &str, v: i32) -> (String, i32, Vec<u8>) {
        (name.to_owned(), field_type::INT32, v.to_ne_bytes().to_vec())
    }
    fn parse_owned(fields: &[(String, i32, Vec<u8>)]) -> Result<PluginConfig> {
        let views: Vec<_> =
            fields.iter().map(|(n, t, b)| IncomingField { name: n, field_type: *t, length: 1, bytes: b }).collect();
        parse(&views)
    }

    #[test]
    fn tp_size_alone_gives_edge_llm_defaults() {
        let c = parse_owned(&[int("tp_size", 2)]).unwrap();
        assert_eq!(c, PluginConfig::with_tp_size(2).unwrap());
        assert_eq!(c.strategy, Strategy::Auto);
        assert!(!c.fuses_residual_rms_norm());
        let out = serialize(&c);
        assert_eq!(out.len(), 1, "only tp_size is serialized at defaults: {out:?}");
        assert_eq!(out[0].name, "tp_size");
        assert_eq!(out[0].bytes, 2i32.to_ne_bytes());
    }

    #[test]
    fn missing_tp_size_is_an_error() {
        assert!(matches!(parse_owned(&[int("strategy", 1)]), Err(Error::MissingField("tp_size"))));
        assert!(matches!(parse(&[]), Err(Error::MissingField("tp_size"))));
    }

    #[test]
    fn every_field_round_trips() {
        let eps = 1e-5f32;
        let fields = vec![
            int("tp_size", 8),
            int("strategy", 2),
            int("config", 1),
            int("fusion_op", 1),
            ("eps".to_owned(), field_type::FLOAT32, eps.to_ne_bytes().to_vec()),
            int("has_bias", 1),
        ];
        let c = parse_owned(&fields).unwrap();
        assert_eq!(
            (c.tp_size, c.strategy, c.config, c.fusion_op, c.eps),
            (8, Strategy::TwoShot, 1, FusionOp::ResidualRmsNorm, eps)
        );
        let again: Vec<_> = serialize(&c).into_iter().map(|f| (f.name.to_owned(), f.field_type, f.bytes)).collect();
        assert_eq!(again.len(), 6);
        assert_eq!(parse_owned(&again).unwrap(), c);
    }

    #[test]
    fn bad_fields_are_rejected_with_their_name() {
        type Case = (Vec<(String, i32, Vec<u8>)>, &'static str);
        let cases: Vec<Case> = vec![
            (vec![int("tp_size", 0)], "tp_size"),
            (vec![int("tp_size", -3)], "tp_size"),
            (vec![int("tp_size", 2), int("strategy", 4)], "strategy"),
            (vec![int("tp_size", 2), int("config", 4)], "config"),
            (vec![int("tp_size", 2), int("fusion_op", 2)], "fusion_op"),
            (vec![int("tp_size", 2), ("eps".into(), field_type::FLOAT32, f32::NAN.to_ne_bytes().to_vec())], "eps"),
            (vec![int("tp_size", 2), ("eps".into(), field_type::INT32, 1i32.to_ne_bytes().to_vec())], "eps"),
            (vec![("tp_size".into(), field_type::FLOAT32, 2f32.to_ne_bytes().to_vec())], "tp_size"),
            (vec![("tp_size".into(), field_type::INT32, vec![])], "tp_size"),
            (vec![int("tp_size", 2), int("tp_size", 2)], "tp_size"),
            (vec![int("tp_size", 2), int("tp_sise", 2)], "tp_sise"),
        ];
        for (fields, name) in cases {
            let err = parse_owned(&fields).expect_err(&format!("{fields:?} must fail"));
            assert!(err.to_string().contains(name), "error '{err}' should name '{name}'");
        }
    }

    #[test]
    fn int64_and_float64_are_accepted_when_in_range() {
        let fields = vec![
            ("tp_size".to_owned(), field_type::INT64, 4i64.to_ne_bytes().to_vec()),
            ("eps".to_owned(), field_type::FLOAT64, 1e-3f64.to_ne_bytes().to_vec()),
        ];
        let c = parse_owned(&fields).unwrap();
        assert_eq!(c.tp_size, 4);
        assert!((c.eps - 1e-3).abs() < 1e-9);
        let too_big = vec![("tp_size".to_owned(), field_type::INT64, (1i64 << 40).to_ne_bytes().to_vec())];
        assert!(parse_owned(&too_big).is_err());
    }

    #[test]
    fn wrong_length_is_rejected() {
        let b = [2i32.to_ne_bytes(), 2i32.to_ne_bytes()].concat();
        let f = IncomingField { name: "tp_size", field_type: field_type::INT32, length: 2, bytes: &b };
        assert!(parse(&[f]).unwrap_err().to_string().contains("exactly 1"));
    }

    #[test]
    fn declared_fields_match_the_table() {
        let names: Vec<_> = declared().iter().map(|f| f.name).collect();
        assert_eq!(names, ["tp_size", "strategy", "config", "fusion_op", "eps", "has_bias"]);
    }
}
