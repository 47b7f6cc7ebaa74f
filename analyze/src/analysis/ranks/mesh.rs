//! The job's process groups as partitions of its ranks.
//!
//! Every candidate reduction set of the amax check, and every group whose members must agree, is a
//! partition of the ranks into components:
//! - each declared group (`manifest.parallel.groups`): its instances (a rank in none is alone);
//! - each combination of declared groups: the ranks reachable from a rank through instances of
//!   those groups. This is [`Parallel::amax_set`] closed under itself: the union of a rank's own
//!   instances, then of its members' instances, … For groups that nest (or one group) it is the
//!   union `amax_set` returns; for groups that cross, as FSDP and tensor parallelism over a 2-D
//!   mesh, it is the mesh slice they span, which is what one logical tensor sharded over both is
//!   reduced over (and the only set on which all members of each group see the same amax);
//! - `world`, every rank.
//!
//! Partitions that split the ranks alike are one candidate (the first by size keeps its name;
//! one equal to every rank is `world`). Candidates are ordered by the mean size of a rank's
//! component, so the first that reproduces an amax is the smallest.

use fp8scope_schemas::ranks::{GroupKind, Parallel, ProcessGroup};
use std::collections::HashMap;

/// One candidate partition of the ranks.
#[derive(Clone, Debug)]
pub struct Partition {
    /// `tp`, `fsdp+tp`, `world`.
    pub label: String,
    /// Indices of the declared groups it is built from (empty for `world`).
    pub groups: Vec<usize>,
    /// The component of each rank 0..n.
    pub comp: Vec<u32>,
    /// Ranks in each component.
    pub sizes: Vec<u32>,
    /// Mean over ranks of the size of the rank's component.
    pub mean_size: f64,
}

impl Partition {
    /// Number of components.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }
    /// Whether it has no component (no rank).
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }
}

/// A declared group that the agreement checks hold to a rule.
#[derive(Clone, Debug)]
pub struct Checked {
    pub name: String,
    pub kind: GroupKind,
    /// Its partition among [`Mesh::partitions`].
    pub partition: usize,
}

/// The ranks, the declared groups and every candidate partition.
#[derive(Clone, Debug)]
pub struct Mesh {
    /// Ranks 0..n.
    pub n: u32,
    pub parallel: Parallel,
    /// Candidates, smallest first; `world` is among them.
    pub partitions: Vec<Partition>,
    /// The partition of each combination of declared groups (sorted indices).
    by_groups: HashMap<Vec<usize>, usize>,
    /// The dp, fsdp and tp groups, whose members must agree.
    pub checked: Vec<Checked>,
}

/// Combinations of declared groups are enumerated up to this many groups; past it only single
/// groups, the configured sets and `world` are candidates.
const MAX_COMBINED_GROUPS: usize = 6;

struct UnionFind(Vec<u32>);

impl UnionFind {
    fn new(n: usize) -> Self {
        UnionFind((0..n as u32).collect())
    }
    fn find(&mut self, mut x: u32) -> u32 {
        while self.0[x as usize] != x {
            let p = self.0[self.0[x as usize] as usize];
            self.0[x as usize] = p;
            x = p;
        }
        x
    }
    fn union(&mut self, a: u32, b: u32) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
            self.0[hi as usize] = lo;
        }
    }
    /// Component ids numbered by first appearance, and their sizes.
    fn components(&mut self) -> (Vec<u32>, Vec<u32>) {
        let n = self.0.len();
        let mut id: HashMap<u32, u32> = HashMap::new();
        let mut comp = Vec::with_capacity(n);
        let mut sizes: Vec<u32> = Vec::new();
        for x in 0..n as u32 {
            let root = self.find(x);
            let next = id.len() as u32;
            let c = *id.entry(root).or_insert(next);
            if c as usize == sizes.len() {
                sizes.push(0);
            }
            sizes[c as usize] += 1;
            comp.push(c);
        }
        (comp, sizes)
    }
}

impl Mesh {
    /// The mesh of a job of `world_size` ranks (at least every rank its groups and `present` name).
    pub fn new(parallel: Option<&Parallel>, world_size: u32, present: &[u32]) -> Mesh {
        let parallel = parallel.cloned().unwrap_or_default();
        let groups = &parallel.groups;
        let n = groups
            .iter()
            .flat_map(|g| g.members.iter().flatten().map(|r| r + 1))
            .chain(present.iter().map(|r| r + 1))
            .chain([world_size.max(1)])
            .max()
            .unwrap_or(1);
        let k = groups.len();
        let mut subsets: Vec<Vec<usize>> = Vec::new();
        if k <= MAX_COMBINED_GROUPS {
            for mask in 1u32..(1 << k) {
                subsets.push((0..k).filter(|i| mask & (1 << i) != 0).collect());
            }
        } else {
            subsets.extend((0..k).map(|i| vec![i]));
            for role in ["activation", "weight", "gradient"] {
                let s = Self::indices(groups, &parallel.amax_groups_of(role));
                if !s.is_empty() && !subsets.contains(&s) {
                    subsets.push(s);
                }
            }
        }
        // Fewer groups first, so that a combination equal to a single group keeps the group's name.
        subsets.sort_by_key(|s| (s.len(), s.clone()));
        let mut partitions: Vec<Partition> = Vec::new();
        let mut by_groups: HashMap<Vec<usize>, usize> = HashMap::new();
        let world = Partition { label: "world".into(), groups: Vec::new(), comp: vec![0; n as usize], sizes: vec![n], mean_size: n as f64 };
        let mut candidates: Vec<Partition> = subsets
            .iter()
            .map(|s| {
                let mut uf = UnionFind::new(n as usize);
                for &g in s {
                    for inst in &groups[g].members {
                        for w in inst.windows(2) {
                            uf.union(w[0], w[1]);
                        }
                    }
                }
                let (comp, sizes) = uf.components();
                let mean_size = comp.iter().map(|&c| sizes[c as usize] as f64).sum::<f64>() / n as f64;
                let label = s.iter().map(|&g| groups[g].name.as_str()).collect::<Vec<_>>().join("+");
                Partition { label, groups: s.clone(), comp, sizes, mean_size }
            })
            .collect();
        candidates.push(world);
        let mut subset_of: Vec<Vec<usize>> = subsets.clone();
        subset_of.push(Vec::new());
        for (p, s) in candidates.into_iter().zip(subset_of) {
            let same = partitions.iter().position(|q| q.comp == p.comp);
            let index = match same {
                Some(i) => {
                    if p.sizes.len() == 1 && n > 1 {
                        partitions[i].label = "world".into();
                    }
                    i
                }
                None => {
                    let mut p = p;
                    if p.sizes.len() == 1 && n > 1 {
                        p.label = "world".into();
                    }
                    partitions.push(p);
                    partitions.len() - 1
                }
            };
            if !s.is_empty() {
                by_groups.insert(s, index);
            }
        }
        // Smallest first (stable: ties keep fewer groups first).
        let mut order: Vec<usize> = (0..partitions.len()).collect();
        order.sort_by(|&a, &b| partitions[a].mean_size.total_cmp(&partitions[b].mean_size).then(partitions[a].groups.len().cmp(&partitions[b].groups.len())));
        let new_index: HashMap<usize, usize> = order.iter().enumerate().map(|(new, &old)| (old, new)).collect();
        let partitions: Vec<Partition> = order.iter().map(|&i| partitions[i].clone()).collect();
        let by_groups: HashMap<Vec<usize>, usize> = by_groups.into_iter().map(|(s, i)| (s, new_index[&i])).collect();
        let checked = groups
            .iter()
            .enumerate()
            .filter(|(_, g)| matches!(g.kind, GroupKind::Dp | GroupKind::Fsdp | GroupKind::Tp))
            .filter_map(|(i, g)| by_groups.get(&vec![i]).map(|&p| Checked { name: g.name.clone(), kind: g.kind, partition: p }))
            .collect();
        Mesh { n, parallel, partitions, by_groups, checked }
    }

    fn indices(groups: &[ProcessGroup], chosen: &[&ProcessGroup]) -> Vec<usize> {
        let mut v: Vec<usize> = chosen.iter().filter_map(|c| groups.iter().position(|g| g.name == c.name)).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The partition a cast of `role` is configured to reduce its amax over (None: its own tensor),
    /// with its label.
    pub fn expected(&self, role: &str) -> Option<usize> {
        let s = Self::indices(&self.parallel.groups, &self.parallel.amax_groups_of(role));
        if s.is_empty() {
            return None;
        }
        self.by_groups.get(&s).copied()
    }

    /// The label of the expected set of `role`: the partition's, or `local`.
    pub fn expected_label(&self, role: &str) -> String {
        self.expected(role).map_or_else(|| "local".to_string(), |p| self.partitions[p].label.clone())
    }

    /// The ranks of every component of partition `p`.
    pub fn members(&self, p: usize) -> Vec<Vec<u32>> {
        let part = &self.partitions[p];
        let mut out = vec![Vec::new(); part.len()];
        for (r, &c) in part.comp.iter().enumerate() {
            out[c as usize].push(r as u32);
        }
        out
    }
}
