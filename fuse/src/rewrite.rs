//! Replaces matched chains by fused `AllReducePlugin` nodes. The fused node's outputs keep the
//! names of the normed value and of the residual sum, so their consumers (and graph outputs)
//! read them unchanged. Layout ops between the all-reduce and the residual Add now read x (they
//! commute with the all-reduce). Constants and casts that only fed the removed nodes go with
//! them; nothing else changes, and node order changes only where the nodes' inputs require it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use crate::proto::{attribute_proto::AttributeType, AttributeProto, GraphProto, NodeProto, TensorProto};

use crate::chain::Chain;
use crate::graph::{is_op, outer_names, subgraphs};

/// The plugin fields set on every fused node beyond those the pass derives.
#[derive(Clone, Debug, Default)]
pub struct Fields {
    pub strategy: Option<i64>,
    pub config: Option<i64>,
}

/// A chain to replace, with the gamma value the fused node reads and, when that value is new,
/// its initializer.
pub struct Planned<'c> {
    pub chain: &'c Chain,
    pub gamma: String,
    pub new_initializer: Option<TensorProto>,
}

fn int(name: &str, i: i64) -> AttributeProto {
    AttributeProto { name: name.into(), type_: AttributeType::INT.into(), i, ..Default::default() }
}

fn float(name: &str, f: f32) -> AttributeProto {
    AttributeProto { name: name.into(), type_: AttributeType::FLOAT.into(), f, ..Default::default() }
}

/// The fused node: the all-reduce node with its attributes (tp_size and any others), the fused
/// op's fields, inputs `(x, residual, gamma[, bias])` and `(normed, residual_out)`: `normed` is the norm's output, or a new value when layout
/// ops between the sum and the norm change the shape (their copies then make the norm's output).
pub fn fused_node(all_reduce: &NodeProto, plan: &Planned, fields: &Fields, normed: &str) -> NodeProto {
    let chain = plan.chain;
    let mut node = all_reduce.clone();
    let derived = ["fusion_op", "eps", "has_bias"];
    let overridden: Vec<&str> = [("strategy", fields.strategy), ("config", fields.config)]
        .iter()
        .filter(|(_, v)| v.is_some())
        .map(|(n, _)| *n)
        .collect();
    node.attribute.retain(|a| !derived.contains(&a.name.as_str()) && !overridden.contains(&a.name.as_str()));
    node.attribute.push(int("fusion_op", 1));
    node.attribute.push(float("eps", chain.norm.eps));
    if chain.bias.is_some() {
        node.attribute.push(int("has_bias", 1));
    }
    if let Some(s) = fields.strategy {
        node.attribute.push(int("strategy", s));
    }
    if let Some(c) = fields.config {
        node.attribute.push(int("config", c));
    }
    node.input = vec![chain.fused_x.clone(), chain.residual.clone(), plan.gamma.clone()];
    node.input.extend(chain.bias.clone());
    node.output = vec![normed.to_owned(), chain.sum.clone()];
    if !node.name.is_empty() {
        node.name = format!("{}/fused_residual_rmsnorm", node.name);
    }
    node
}

/// Applies `plans` (chains with no node in common) to `graph`.
pub fn apply(graph: &mut GraphProto, plans: &[Planned], fields: &Fields) {
    let mut replace: HashMap<usize, Vec<NodeProto>> = HashMap::new();
    let mut removed: HashSet<usize> = HashSet::new();
    let mut names: HashSet<String> = graph.node.iter().flat_map(|n| n.output.iter().cloned()).collect();
    names.extend(graph.input.iter().map(|i| i.name.clone()));
    names.extend(graph.initializer.iter().map(|t| t.name.clone()));
    for plan in plans {
        let chain = plan.chain;
        // The fused node takes the residual Add's place: every input of the chain but gamma is
        // ready there; the sort below moves it if gamma is produced later.
        let at = chain.nodes.iter().copied().find(|&i| graph.node[i].output.first() == Some(&chain.sum));
        let at = at.expect("a chain contains the Add that makes its residual sum");
        let norm = &chain.norm;
        let normed = if norm.relayout { fresh(&mut names, &format!("{}_fused", norm.out)) } else { norm.out.clone() };
        let mut new_nodes = vec![fused_node(&graph.node[chain.all_reduce], plan, fields, &normed)];
        if norm.relayout {
            // The layout ops again, on the normed value: they make the norm's output.
            let mut value = normed;
            for (k, &l) in norm.layout.iter().enumerate() {
                let mut copy = graph.node[l].clone();
                copy.input[0] = value;
                value = if k + 1 == norm.layout.len() {
                    norm.out.clone()
                } else {
                    fresh(&mut names, &format!("{}_fused", copy.output[0]))
                };
                copy.output = vec![value.clone()];
                if !copy.name.is_empty() {
                    copy.name = format!("{}/fused_normed", copy.name);
                }
                new_nodes.push(copy);
            }
        }
        replace.insert(at, new_nodes);
        removed.extend(chain.nodes.iter().filter(|&&i| i != at));
        if let Some(&first) = chain.hoisted.first() {
            graph.node[first].input[0] = chain.x.clone();
        }
        graph.initializer.extend(plan.new_initializer.clone());
    }
    let mut dropped: HashSet<String> = HashSet::new();
    let mut freed: Vec<String> = Vec::new();
    for &i in removed.iter().chain(replace.keys()) {
        freed.extend(graph.node[i].input.iter().filter(|v| !v.is_empty()).cloned());
        dropped.extend(graph.node[i].output.iter().cloned());
    }
    let nodes = std::mem::take(&mut graph.node);
    graph.node = nodes
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !removed.contains(i))
        .flat_map(|(i, n)| replace.remove(&i).unwrap_or_else(|| vec![n]))
        .collect();
    dropped.retain(|v| !graph.node.iter().any(|n| n.output.contains(v)));
    dropped.extend(remove_dead_feeders(graph, freed));
    graph.value_info.retain(|v| !dropped.contains(&v.name));
    stable_topological_sort(graph);
}

/// `base`, or `base_2`, `base_3`, ... : a name no value has yet, then taken.
fn fresh(names: &mut HashSet<String>, base: &str) -> String {
    let mut name = base.to_owned();
    let mut k = 1;
    while names.contains(&name) {
        k += 1;
        name = format!("{base}_{k}");
    }
    names.insert(name.clone());
    name
}

/// Removes the constants, pure conversions and layout ops (`Constant`, `Cast`, `Identity`,
/// `Reshape`, `Squeeze`, `Unsqueeze`, `Flatten`) and the
/// initializers that only fed removed nodes; returns the names that no longer exist.
fn remove_dead_feeders(graph: &mut GraphProto, mut freed: Vec<String>) -> Vec<String> {
    let mut gone = Vec::new();
    while let Some(v) = freed.pop() {
        let mut used: HashSet<&str> = graph.output.iter().map(|o| o.name.as_str()).collect();
        for node in &graph.node {
            used.extend(node.input.iter().map(String::as_str));
            for sub in subgraphs(node) {
                outer_names(sub, &mut used);
            }
        }
        if used.contains(v.as_str()) || graph.input.iter().any(|i| i.name == v) {
            continue;
        }
        let producer = graph.node.iter().position(|n| n.output.contains(&v));
        if let Some(p) = producer {
            let n = &graph.node[p];
            let pure = ["Constant", "Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"]
                .iter()
                .any(|op| is_op(n, op))
                && n.output.len() == 1;
            if pure {
                let n = graph.node.remove(p);
                freed.extend(n.input.into_iter().filter(|i| !i.is_empty()));
                gone.push(v);
            }
        } else if let Some(t) = graph.initializer.iter().position(|t| t.name == v) {
            graph.initializer.remove(t);
            gone.push(v);
        }
    }
    gone
}

/// Orders nodes so each comes after the producers of what it reads (its inputs and the outer
/// values its subgraphs read), keeping the existing order wherever it already is valid.
pub fn stable_topological_sort(graph: &mut GraphProto) {
    let producer: HashMap<&str, usize> =
        graph.node.iter().enumerate().flat_map(|(i, n)| n.output.iter().map(move |o| (o.as_str(), i))).collect();
    let n = graph.node.len();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut waiting = vec![0usize; n];
    for (i, node) in graph.node.iter().enumerate() {
        let mut reads: HashSet<&str> = node.input.iter().map(String::as_str).collect();
        for sub in subgraphs(node) {
            outer_names(sub, &mut reads);
        }
        let deps: HashSet<usize> = reads.iter().filter_map(|r| producer.get(r)).copied().filter(|&p| p != i).collect();
        waiting[i] = deps.len();
        for d in deps {
            dependents[d].push(i);
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> = (0..n).filter(|&i| waiting[i] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        for &d in &dependents[i] {
            waiting[d] -= 1;
            if waiting[d] == 0 {
                ready.push(Reverse(d));
            }
        }
    }
    if order.len() != n || order.iter().enumerate().all(|(k, &i)| k == i) {
        return; // already ordered, or a cycle: leave it for the structural check to report
    }
    let mut nodes: Vec<Option<NodeProto>> = std::mem::take(&mut graph.node).into_iter().map(Some).collect();
    graph.node = order.into_iter().map(|i| nodes[i].take().expect("each node is placed once")).collect();
}
