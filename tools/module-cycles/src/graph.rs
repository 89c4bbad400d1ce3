//! Circles in a dependency graph: its strongly connected components of more than one node
//! (Tarjan's algorithm), an edge to one's own ancestor left out (a child using what its parent
//! declares for all its children is the module tree itself).

use std::collections::{BTreeMap, BTreeSet};

use crate::paths::Module;

/// The top-level module `module` belongs to (the root is its own).
pub(crate) fn top(module: &Module) -> Module {
    module.iter().take(1).cloned().collect()
}

/// Whether `b` is a strict ancestor of `a`.
fn ancestor(a: &Module, b: &Module) -> bool {
    b.len() < a.len() && a.starts_with(b)
}

/// The circles among `nodes` along `edges`, each sorted and named `a::b` (the root `(crate
/// root)`), in order.
pub(crate) fn circles(nodes: &[Module], edges: &[(Module, Module)]) -> Vec<Vec<String>> {
    let mut graph: BTreeMap<&Module, BTreeSet<&Module>> =
        nodes.iter().map(|n| (n, BTreeSet::new())).collect();
    for (from, to) in edges {
        if from != to && !ancestor(from, to) {
            graph.entry(from).or_default().insert(to);
            graph.entry(to).or_default();
        }
    }
    let mut tarjan = Tarjan {
        graph: &graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !tarjan.index.contains_key(node) {
            tarjan.visit(node);
        }
    }
    let mut found: Vec<Vec<String>> = tarjan
        .found
        .into_iter()
        .map(|component| {
            let mut names: Vec<String> = component.into_iter().map(name).collect();
            names.sort();
            names
        })
        .collect();
    found.sort();
    found
}

/// The edges between two different top-level modules of `circle` (named as [`circles`] names
/// them), each `(from, to)` named in full, in order.
pub(crate) fn crossings(circle: &[String], edges: &[(Module, Module)]) -> Vec<(String, String)> {
    let member = |m: &Module| circle.contains(&name(&top(m)));
    let mut found: Vec<(String, String)> = edges
        .iter()
        .filter(|(from, to)| top(from) != top(to) && member(from) && member(to))
        .map(|(from, to)| (name(from), name(to)))
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The top-level modules by layer, lowest first: a module's layer is one above the highest of
/// the modules it uses (0 when it uses none). `None` when the modules form a circle.
pub(crate) fn layers(nodes: &[Module], edges: &[(Module, Module)]) -> Option<Vec<Vec<String>>> {
    let tops: BTreeSet<Module> = nodes.iter().map(top).collect();
    let mut uses: BTreeMap<&Module, BTreeSet<Module>> =
        tops.iter().map(|t| (t, BTreeSet::new())).collect();
    for (from, to) in edges {
        let (from, to) = (top(from), top(to));
        if from != to && !to.is_empty() {
            uses.entry(tops.get(&from)?).or_default().insert(to);
        }
    }
    let mut layer: BTreeMap<&Module, usize> = BTreeMap::new();
    // Each round places every module whose uses are all placed; a round that places nothing
    // means a circle.
    while layer.len() < uses.len() {
        let ready: Vec<(&Module, usize)> = uses
            .iter()
            .filter(|(m, _)| !layer.contains_key(*m))
            .filter_map(|(m, used)| {
                used.iter()
                    .map(|u| layer.get(u).map(|l| l + 1))
                    .try_fold(0, |most, l| Some(most.max(l?)))
                    .map(|l| (*m, l))
            })
            .collect();
        if ready.is_empty() {
            return None;
        }
        layer.extend(ready);
    }
    let mut by_layer: Vec<Vec<String>> =
        vec![Vec::new(); layer.values().max().map_or(0, |l| l + 1)];
    for (module, l) in layer {
        by_layer[l].push(name(module));
    }
    Some(by_layer)
}

fn name(module: &Module) -> String {
    if module.is_empty() {
        "(crate root)".into()
    } else {
        module.join("::")
    }
}

struct Tarjan<'g> {
    graph: &'g BTreeMap<&'g Module, BTreeSet<&'g Module>>,
    index: BTreeMap<&'g Module, usize>,
    low: BTreeMap<&'g Module, usize>,
    stack: Vec<&'g Module>,
    on_stack: BTreeSet<&'g Module>,
    next: usize,
    found: Vec<Vec<&'g Module>>,
}

impl<'g> Tarjan<'g> {
    fn visit(&mut self, v: &'g Module) {
        self.index.insert(v, self.next);
        self.low.insert(v, self.next);
        self.next += 1;
        self.stack.push(v);
        self.on_stack.insert(v);
        let graph = self.graph;
        for &w in graph.get(v).into_iter().flatten() {
            if !self.index.contains_key(w) {
                self.visit(w);
                let low = self.low[v].min(self.low[w]);
                self.low.insert(v, low);
            } else if self.on_stack.contains(w) {
                let low = self.low[v].min(self.index[w]);
                self.low.insert(v, low);
            }
        }
        if self.low[v] == self.index[v] {
            let mut component = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack.remove(w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                self.found.push(component);
            }
        }
    }
}
