//! Whose creator TensorRT sees: the overlay's registration policy. `cpp/registration.cpp` does
//! the registry's mechanics (look up, withdraw, register, through TensorRT's vtables) and asks
//! these functions what to do; they decide from the facts it passes (a creator's kind, name and
//! the library its code lives in) and the base this library loaded.
//!
//! The policy:
//! - `AllReducePlugin` is always ours, in every namespace and whatever the load order: a creator
//!   of it from another library is withdrawn. Replacing the base's is the overlay working (info);
//!   replacing one of any other library means two Edge-LLM plugin libraries are in the process,
//!   which a user should hear about (warning).
//! - The base's other creators are the base's V3 creators (every Edge-LLM plugin has one): found
//!   by where their code lives, the base's load address.
//! - In namespace "" the base registers its creators itself; in any other namespace
//!   (`initEdgellmPlugins(logger, ns)`) this library registers them there too, as Edge-LLM's own
//!   `initEdgellmPlugins` does, unless that namespace has one by that name already.

use crate::log::Severity;

/// The plugin this library serves, as TensorRT's registry names it.
pub(crate) const ALL_REDUCE: (&str, &str) = ("AllReducePlugin", "1");
/// The interface kind of the creators Edge-LLM's plugins have (`IPluginCreatorV3One`).
const V3_ONE: &str = "PLUGIN CREATOR_V3ONE";

/// What to do with a creator of `AllReducePlugin` in `namespace` that is not ours.
#[derive(Debug, PartialEq)]
pub(crate) struct Replacement {
    pub replace: bool,
    pub severity: Severity,
    pub line: String,
}

/// The registered `AllReducePlugin` creator of `owner_file` (loaded at `owner_address`), in
/// `namespace`, where the base (if any) is loaded at `base_address`.
pub(crate) fn replace_all_reduce(
    namespace: &str,
    owner_file: &str,
    owner_address: usize,
    base_address: usize,
) -> Replacement {
    let (name, version) = ALL_REDUCE;
    let owner = if owner_file.is_empty() { "an unknown library" } else { owner_file };
    let is_base = base_address != 0 && owner_address == base_address;
    Replacement {
        replace: true,
        severity: if is_base { Severity::Info } else { Severity::Warning },
        line: if is_base {
            format!(
                "{name} (version {version}, namespace \"{namespace}\") of {owner} is replaced by edgellm-allreduce's"
            )
        } else {
            format!(
                "{name} (version {version}, namespace \"{namespace}\") of {owner} is replaced by edgellm-allreduce's: \
                 a second Edge-LLM plugin library is loaded in this process (load only edgellm-allreduce's, which \
                 serves every plugin of Edge-LLM's through its base)"
            )
        },
    }
}

/// Whether a registered creator is one of the base's that this library serves beside its own:
/// a V3 creator whose code lives in the base, other than `AllReducePlugin`.
pub(crate) fn is_base_creator(kind: &str, name: &str, owner_address: usize, base_address: usize) -> bool {
    base_address != 0 && owner_address == base_address && kind == V3_ONE && name != ALL_REDUCE.0
}

/// Whether this library registers the base's creators in `namespace` (the base does "" itself).
pub(crate) fn mirrors_base_in(namespace: &str) -> bool {
    !namespace.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: usize = 0x7000_0000;

    #[test]
    fn the_bases_all_reduce_is_replaced_quietly() {
        let r = replace_all_reduce("", "/opt/libNvInfer_edgellm_plugin_base.so", BASE, BASE);
        assert!(r.replace);
        assert_eq!(r.severity, Severity::Info);
        assert!(r.line.contains("/opt/libNvInfer_edgellm_plugin_base.so") && r.line.contains("namespace \"\""));
    }

    #[test]
    fn another_librarys_all_reduce_is_replaced_with_a_warning() {
        for base in [BASE, 0] {
            let r = replace_all_reduce("ns", "/x/libNvInfer_edgellm_plugin.so", 0x1000, base);
            assert!(r.replace);
            assert_eq!(r.severity, Severity::Warning);
            assert!(r.line.contains("a second Edge-LLM plugin library") && r.line.contains("namespace \"ns\""));
        }
        assert!(replace_all_reduce("", "", 0, 0).line.contains("an unknown library"));
    }

    #[test]
    fn base_creators_are_the_bases_v3_creators_but_all_reduce() {
        assert!(is_base_creator(V3_ONE, "Int4GroupwiseGemmPlugin", BASE, BASE));
        assert!(!is_base_creator(V3_ONE, "AllReducePlugin", BASE, BASE));
        assert!(!is_base_creator("PLUGIN CREATOR_V2", "Int4GroupwiseGemmPlugin", BASE, BASE));
        assert!(!is_base_creator(V3_ONE, "Int4GroupwiseGemmPlugin", 0x1000, BASE));
        // No base: nothing is the base's, even a creator whose owner could not be found (0).
        assert!(!is_base_creator(V3_ONE, "Int4GroupwiseGemmPlugin", 0, 0));
    }

    #[test]
    fn the_base_is_mirrored_only_outside_the_default_namespace() {
        assert!(!mirrors_base_in(""));
        assert!(mirrors_base_in("edgellm"));
    }
}
