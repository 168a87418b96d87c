//! Flame graph trees: weighted stacks merged by function name from the
//! root down, written compactly for the page (`[name id, weight in µs,
//! [children]]`, heaviest child first).

use std::collections::HashMap;

use std::fmt::Write as _;

#[derive(Debug, Clone)]
struct Node {
    name: u32,
    weight: u64,
    children: Vec<u32>,
}

/// Stands for the root as a parent.
const ROOT: u32 = u32::MAX;

/// A flame graph of weighted stacks (weights in nanoseconds), its nodes in an
/// arena found by (parent, name).
#[derive(Debug, Clone, Default)]
pub(crate) struct Flame {
    nodes: Vec<Node>,
    roots: Vec<u32>,
    index: HashMap<(u32, u32), u32>,
    total: u64,
    samples: usize,
}

impl Flame {
    /// Adds one stack (name ids, root first) with its weight.
    pub(crate) fn add(&mut self, stack: &[u32], weight: u64) {
        self.samples += 1;
        if weight == 0 {
            return;
        }
        self.total += weight;
        let mut parent = ROOT;
        for &name in stack {
            let next = self.nodes.len() as u32;
            let i = *self.index.entry((parent, name)).or_insert(next);
            if i == next {
                self.nodes.push(Node {
                    name,
                    weight: 0,
                    children: Vec::new(),
                });
                match parent {
                    ROOT => self.roots.push(i),
                    p => self.nodes[p as usize].children.push(i),
                }
            }
            self.nodes[i as usize].weight += weight;
            parent = i;
        }
    }

    /// Total weight, in nanoseconds.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Samples added (weighted or not).
    pub(crate) fn samples(&self) -> usize {
        self.samples
    }

    /// Weight of the nodes named `name` at any depth, counted once per
    /// path (a recursive function is not counted twice).
    pub(crate) fn weight_of(&self, name: u32) -> u64 {
        let mut sum = 0;
        let mut todo: Vec<u32> = self.roots.clone();
        while let Some(i) = todo.pop() {
            let n = &self.nodes[i as usize];
            if n.name == name {
                sum += n.weight;
            } else {
                todo.extend(&n.children);
            }
        }
        sum
    }

    /// Writes the tree as the page reads it, leaving out nodes lighter than
    /// `min_share` of the total (too narrow to see; their weight stays in
    /// their parent).
    pub(crate) fn write_json(&self, min_share: f64, out: &mut String) {
        let min = (self.total as f64 * min_share) as u64;
        self.write_level(&self.roots, min, out);
    }

    fn write_level(&self, ids: &[u32], min: u64, out: &mut String) {
        let mut kept: Vec<&Node> = ids
            .iter()
            .map(|&i| &self.nodes[i as usize])
            .filter(|n| n.weight >= min)
            .collect();
        kept.sort_by_key(|n| std::cmp::Reverse(n.weight));
        out.push('[');
        for (k, n) in kept.into_iter().enumerate() {
            if k > 0 {
                out.push(',');
            }
            let _ = write!(out, "[{},{},", n.name, micros(n.weight));
            self.write_level(&n.children, min, out);
            out.push(']');
        }
        out.push(']');
    }

    /// [`Flame::write_json`] into a new string.
    pub(crate) fn to_json(&self, min_share: f64) -> String {
        let mut out = String::new();
        self.write_json(min_share, &mut out);
        out
    }
}

fn micros(ns: u64) -> u64 {
    (ns + 500) / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_by_name_from_the_root_and_prunes_narrow_nodes() {
        let mut f = Flame::default();
        f.add(&[0, 1, 2], 10_000_000);
        f.add(&[0, 1, 3], 20_000_000);
        f.add(&[0, 4], 10_000);
        f.add(&[5], 0);
        assert_eq!(f.samples(), 4);
        assert_eq!(f.total(), 30_010_000);
        assert_eq!(f.weight_of(1), 30_000_000);
        assert_eq!(
            f.to_json(0.001),
            "[[0,30010,[[1,30000,[[3,20000,[]],[2,10000,[]]]]]]]"
        );
    }
}
