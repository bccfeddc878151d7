//! A structural check of a model, the part of ONNX's checker that a graph rewrite can break:
//! every value is defined once and before it is read, graph outputs exist, and every node's
//! domain is imported.

use std::collections::HashSet;

use crate::proto::{GraphProto, ModelProto};

use crate::graph::{outer_names, subgraphs};

pub fn check_structure(model: &ModelProto) -> Result<(), String> {
    let graph = model.graph.as_ref().ok_or("the model has no graph")?;
    let imported: HashSet<&str> =
        model.opset_import.iter().map(|o| if o.domain == "ai.onnx" { "" } else { o.domain.as_str() }).collect();
    check_graph(graph, &HashSet::new(), &imported)
}

fn check_graph(graph: &GraphProto, outer: &HashSet<&str>, imported: &HashSet<&str>) -> Result<(), String> {
    let mut defined: HashSet<&str> = outer.clone();
    let mut own: HashSet<&str> = HashSet::new();
    for name in graph.input.iter().map(|i| i.name.as_str()).chain(graph.initializer.iter().map(|t| t.name.as_str())) {
        // An initializer may also be listed as a graph input (a default the caller can override).
        own.insert(name);
        defined.insert(name);
    }
    let mut initializers = HashSet::new();
    if let Some(t) = graph.initializer.iter().find(|t| !initializers.insert(t.name.as_str())) {
        return Err(format!("initializer '{}' is defined twice", t.name));
    }
    for node in &graph.node {
        let label = format!("{} '{}'", node.op_type, node.name);
        let domain = if node.domain == "ai.onnx" { "" } else { node.domain.as_str() };
        if !imported.contains(domain) {
            return Err(format!("{label} is in domain '{domain}', which the model does not import"));
        }
        if let Some(v) = node.input.iter().find(|v| !v.is_empty() && !defined.contains(v.as_str())) {
            return Err(format!("{label} reads '{v}' before anything defines it"));
        }
        for sub in subgraphs(node) {
            let mut reads = HashSet::new();
            outer_names(sub, &mut reads);
            if let Some(v) = reads.iter().find(|v| !defined.contains(*v)) {
                return Err(format!("a subgraph of {label} reads '{v}' before anything defines it"));
            }
            check_graph(sub, &defined, imported)?;
        }
        for out in node.output.iter().filter(|o| !o.is_empty()) {
            if !own.insert(out) {
                return Err(format!("'{out}' is defined twice (again by {label})"));
            }
            defined.insert(out);
        }
    }
    if let Some(o) = graph.output.iter().find(|o| !defined.contains(o.name.as_str())) {
        return Err(format!("graph output '{}' is not defined", o.name));
    }
    Ok(())
}
