//! The names that appear in flags, Parquet columns, reports and verdicts: modules (GEMM sites),
//! GEMM kinds and tensor roles, with their parsing and their order of execution.
//!
//! A GEMM site is `layers.{i}.{qkv|proj|fc1|fc2}`, a GEMM `{site}.{fprop|dgrad|wgrad}` and a tensor
//! `{site}.{role}`. Runs from elsewhere (PyTorch, Transformer Engine logs) name a site by its full
//! module path (`blocks.0.attn.qkv`, `lm_head`) and order sites as their manifest lists them
//! ([`SiteNaming`]); their `layer` column is the path's first integer component ([`layer_of_module`]).

use serde::{Deserialize, Serialize};
use std::fmt;

/// One of the four FP8 GEMM sites of a transformer layer, in forward execution order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Module {
    Qkv,
    Proj,
    Fc1,
    Fc2,
}

impl Module {
    pub const ALL: [Module; 4] = [Module::Qkv, Module::Proj, Module::Fc1, Module::Fc2];
    pub fn as_str(self) -> &'static str {
        match self {
            Module::Qkv => "qkv",
            Module::Proj => "proj",
            Module::Fc1 => "fc1",
            Module::Fc2 => "fc2",
        }
    }
    pub fn parse(s: &str) -> Option<Module> {
        Module::ALL.into_iter().find(|m| m.as_str() == s)
    }
    /// Position in the forward order of a layer (qkv 0 … fc2 3).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The three GEMMs of a linear layer: fprop (Y = X·Wᵀ), dgrad (dX = dY·W), wgrad (dW = dYᵀ·X).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Gemm {
    Fprop,
    Dgrad,
    Wgrad,
}

impl Gemm {
    pub const ALL: [Gemm; 3] = [Gemm::Fprop, Gemm::Dgrad, Gemm::Wgrad];
    pub fn as_str(self) -> &'static str {
        match self {
            Gemm::Fprop => "fprop",
            Gemm::Dgrad => "dgrad",
            Gemm::Wgrad => "wgrad",
        }
    }
    pub fn parse(s: &str) -> Option<Gemm> {
        Gemm::ALL.into_iter().find(|g| g.as_str() == s)
    }
    /// The two operand roles of this GEMM, in (A, B) order as the model casts them.
    pub fn operands(self) -> [Role; 2] {
        match self {
            Gemm::Fprop => [Role::Activation, Role::Weight],
            Gemm::Dgrad => [Role::Gradient, Role::Weight],
            Gemm::Wgrad => [Role::Gradient, Role::Activation],
        }
    }
    /// The role of this GEMM's result.
    pub fn result(self) -> Role {
        match self {
            Gemm::Fprop => Role::Output,
            Gemm::Dgrad => Role::Dgrad,
            Gemm::Wgrad => Role::Wgrad,
        }
    }
}

/// Tensor roles, with Transformer Engine's names. The first three are the quantized ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// X, the input of fprop.
    Activation,
    /// W.
    Weight,
    /// dY, the gradient arriving at the layer's output.
    Gradient,
    /// Y = X·Wᵀ (+ b).
    Output,
    /// dX = dY·W.
    Dgrad,
    /// dW = dYᵀ·X.
    Wgrad,
}

impl Role {
    pub const ALL: [Role; 6] = [Role::Activation, Role::Weight, Role::Gradient, Role::Output, Role::Dgrad, Role::Wgrad];
    pub const QUANTIZED: [Role; 3] = [Role::Activation, Role::Weight, Role::Gradient];
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Activation => "activation",
            Role::Weight => "weight",
            Role::Gradient => "gradient",
            Role::Output => "output",
            Role::Dgrad => "dgrad",
            Role::Wgrad => "wgrad",
        }
    }
    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
    pub fn is_quantized(self) -> bool {
        matches!(self, Role::Activation | Role::Weight | Role::Gradient)
    }
    /// The GEMM operands that are this tensor, as (GEMM, operand index 0 = A, 1 = B), in the order
    /// the GEMMs run: where the FP8 bytes of a quantized role can be taken from.
    pub fn operand_slots(self) -> Vec<(Gemm, usize)> {
        Gemm::ALL.into_iter().flat_map(|g| (0..2).filter(move |&i| g.operands()[i] == self).map(move |i| (g, i))).collect()
    }
    /// Whether the tensor exists in the forward pass (activation, weight, output) or the backward.
    pub fn is_forward(self) -> bool {
        matches!(self, Role::Activation | Role::Weight | Role::Output)
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }
    )*};
}
display_as_str!(Module, Gemm, Role);

/// A GEMM site: one linear layer of one transformer layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Site {
    pub layer: u32,
    pub module: Module,
}

impl Site {
    pub fn new(layer: u32, module: Module) -> Site {
        Site { layer, module }
    }
    /// Parses `layers.3.fc2`.
    pub fn parse(s: &str) -> Option<Site> {
        let rest = s.strip_prefix("layers.")?;
        let (layer, module) = rest.split_once('.')?;
        Some(Site { layer: layer.parse().ok()?, module: Module::parse(module)? })
    }
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "layers.{}.{}", self.layer, self.module)
    }
}

/// Execution-order rank of a tensor of `role` at `site` in a model of `n_layers` layers: forward
/// roles by layer then module order, then backward roles in reverse layer and reverse module order.
/// Used to find "the first tensor that went non-finite" and to break ties in `locate`.
pub fn execution_rank(n_layers: u32, site: Site, role: Role) -> u64 {
    let m = site.module.index() as u64;
    let l = site.layer as u64;
    let role_in_phase = match role {
        Role::Weight => 0,
        Role::Activation => 1,
        Role::Output => 2,
        Role::Gradient => 0,
        Role::Dgrad => 1,
        Role::Wgrad => 2,
    };
    if role.is_forward() {
        (l * 4 + m) * 3 + role_in_phase
    } else {
        let fwd_total = n_layers as u64 * 4 * 3;
        let rev = (n_layers as u64 - 1 - l.min(n_layers as u64 - 1)) * 4 + (3 - m);
        fwd_total + rev * 3 + role_in_phase
    }
}

/// The `layer` of a module path from another framework: its first component that is an integer
/// (`layers.3.fc1` → 3, `model.h.11.mlp.c_fc` → 11), 0 when there is none (`lm_head`).
pub fn layer_of_module(path: &str) -> u32 {
    path.split('.').find_map(|c| if c.bytes().all(|b| b.is_ascii_digit()) { c.parse().ok() } else { None }).unwrap_or(0)
}

/// How the sites of one run are named and put in execution order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SiteNaming {
    /// An `fp8-capture` run: `layers.{layer}.{module}`, ordered by [`execution_rank`].
    Capture { n_layers: u32 },
    /// A run from elsewhere: the module path alone, forward order as `modules` lists them.
    External { modules: Vec<String> },
}

impl SiteNaming {
    /// `layers.1.fc2` (fp8-capture) or the module path (`blocks.0.attn.qkv`).
    pub fn site(&self, layer: i64, module: &str) -> String {
        match self {
            SiteNaming::Capture { .. } => format!("layers.{layer}.{module}"),
            SiteNaming::External { .. } => module.to_string(),
        }
    }
    /// `{site}.{role}`.
    pub fn tensor(&self, layer: i64, module: &str, role: &str) -> String {
        format!("{}.{role}", self.site(layer, module))
    }
    /// `{site}.{gemm}`.
    pub fn gemm(&self, layer: i64, module: &str, gemm: &str) -> String {
        format!("{}.{gemm}", self.site(layer, module))
    }
    /// Rank of a tensor in execution order: forward roles site by site, then backward roles from
    /// the last site back to the first. Names this run does not know sort after every known one.
    pub fn rank(&self, layer: i64, module: &str, role: &str) -> u64 {
        let Some(role) = Role::parse(role) else { return u64::MAX };
        match self {
            SiteNaming::Capture { n_layers } => match (Module::parse(module), u32::try_from(layer)) {
                (Some(m), Ok(l)) => execution_rank(*n_layers, Site::new(l, m), role),
                _ => u64::MAX,
            },
            SiteNaming::External { modules } => {
                let Some(i) = modules.iter().position(|m| m == module) else { return u64::MAX };
                let (i, n) = (i as u64, modules.len() as u64);
                let phase = match role {
                    Role::Weight | Role::Gradient => 0,
                    Role::Activation | Role::Dgrad => 1,
                    Role::Output | Role::Wgrad => 2,
                };
                if role.is_forward() { i * 3 + phase } else { n * 3 + (n - 1 - i) * 3 + phase }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_paths_take_their_first_integer_component_as_layer() {
        assert_eq!(layer_of_module("layers.3.fc1"), 3);
        assert_eq!(layer_of_module("model.h.11.mlp.c_fc"), 11);
        assert_eq!(layer_of_module("blocks_2.attn.qkv"), 0);
        assert_eq!(layer_of_module("lm_head"), 0);
        assert_eq!(layer_of_module("decoder.layers.0.self_attn.q_proj"), 0);
    }

    #[test]
    fn external_sites_are_named_by_path_and_ordered_as_listed() {
        let n = SiteNaming::External { modules: vec!["blocks.0.attn.qkv".into(), "blocks.0.mlp.fc_1".into(), "lm_head".into()] };
        assert_eq!(n.tensor(0, "blocks.0.mlp.fc_1", "gradient"), "blocks.0.mlp.fc_1.gradient");
        let r = |m: &str, role: &str| n.rank(0, m, role);
        assert!(r("blocks.0.attn.qkv", "activation") < r("lm_head", "output"));
        assert!(r("lm_head", "output") < r("lm_head", "gradient"), "forward before backward");
        assert!(r("lm_head", "gradient") < r("blocks.0.attn.qkv", "gradient"), "backward in reverse");
        assert_eq!(r("unknown", "activation"), u64::MAX);
        let c = SiteNaming::Capture { n_layers: 2 };
        assert_eq!(c.gemm(1, "fc2", "dgrad"), "layers.1.fc2.dgrad");
        assert_eq!(c.rank(1, "fc2", "gradient"), execution_rank(2, Site::new(1, Module::Fc2), Role::Gradient));
    }

    #[test]
    fn site_round_trips_and_rejects_garbage() {
        let s = Site::parse("layers.7.fc2").unwrap();
        assert_eq!(s, Site::new(7, Module::Fc2));
        assert_eq!(s.to_string(), "layers.7.fc2");
        for bad in ["layers.x.fc2", "layer.1.fc2", "layers.1.fc3", "layers.1"] {
            assert!(Site::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn operand_slots_list_where_each_quantized_role_is_cast() {
        assert_eq!(Role::Activation.operand_slots(), vec![(Gemm::Fprop, 0), (Gemm::Wgrad, 1)]);
        assert_eq!(Role::Weight.operand_slots(), vec![(Gemm::Fprop, 1), (Gemm::Dgrad, 1)]);
        assert_eq!(Role::Gradient.operand_slots(), vec![(Gemm::Dgrad, 0), (Gemm::Wgrad, 0)]);
        assert!(Role::Output.operand_slots().is_empty());
    }

    #[test]
    fn execution_order_puts_forward_first_and_backward_reversed() {
        let r = |l, m, role| execution_rank(3, Site::new(l, m), role);
        assert!(r(0, Module::Qkv, Role::Activation) < r(0, Module::Fc2, Role::Activation));
        assert!(r(2, Module::Fc2, Role::Output) < r(2, Module::Fc2, Role::Gradient));
        // Backward starts at the last layer's fc2.
        assert!(r(2, Module::Fc2, Role::Gradient) < r(2, Module::Fc1, Role::Gradient));
        assert!(r(2, Module::Qkv, Role::Gradient) < r(1, Module::Fc2, Role::Gradient));
        assert!(r(1, Module::Qkv, Role::Wgrad) < r(0, Module::Fc2, Role::Gradient));
    }
}
