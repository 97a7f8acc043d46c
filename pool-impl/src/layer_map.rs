//! Which layer of each buffer a one-layer transfer names.
//!
//! Without `layer_ids` a layer is a buffer-local index: layer `l` of every buffer with more
//! than `l` layers. When any buffer of either pool gives `layer_ids` (v2: the model layers it
//! serves, e.g. a hybrid model's full-attention and sliding-window groups) a layer is a model
//! layer id: a buffer with `layer_ids` takes part at the position of that id in its list, a
//! buffer without them (a `state` buffer beside the groups) at index `l` when it has more than
//! `l` layers, and a layer no buffer serves is refused naming it
//! ([`TransferError::ModelLayer`]). A buffer's ids are the device's, or the host's where only
//! the host gives them (`compare` requires them equal where both do).

use kvlayout_core::PoolGeometry;

use crate::error::TransferError;
use crate::plan::Layers;

/// The layer mapping of a device/host pair, per device buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerMap {
    /// Per device buffer: its layer count and model layer ids, if given.
    buffers: Vec<(u64, Option<Vec<u32>>)>,
    /// Whether layers are model layer ids (some buffer gives `layer_ids`).
    model_ids: bool,
    /// Largest layer count of any buffer.
    deepest_layers: u64,
}

impl LayerMap {
    /// The mapping of `device` paired with `host` (buffers matched by name).
    pub fn new(device: &PoolGeometry, host: &PoolGeometry) -> LayerMap {
        let buffers: Vec<(u64, Option<Vec<u32>>)> = device
            .buffers
            .iter()
            .map(|b| {
                let host_ids = host
                    .buffer_index(b.name())
                    .and_then(|h| host.buffers[h].layer_ids.clone());
                (b.layers, b.layer_ids.clone().or(host_ids))
            })
            .collect();
        LayerMap {
            model_ids: buffers.iter().any(|(_, ids)| ids.is_some()),
            deepest_layers: buffers.iter().map(|(l, _)| *l).max().unwrap_or(0),
            buffers,
        }
    }

    /// Whether a one-layer transfer's layer is a model layer id.
    pub fn model_ids(&self) -> bool {
        self.model_ids
    }

    /// Largest layer count of any buffer.
    pub fn deepest_layers(&self) -> u64 {
        self.deepest_layers
    }

    /// The index inside device buffer `b` of `layer`, or `None` when `b` does not hold it.
    #[inline]
    pub fn index(&self, b: usize, layer: u64) -> Option<u64> {
        let (layers, ids) = self.buffers.get(b)?;
        match ids {
            Some(ids) if self.model_ids => ids
                .iter()
                .position(|&id| u64::from(id) == layer)
                .map(|i| i as u64),
            _ => (layer < *layers).then_some(layer),
        }
    }

    /// Layers `[first, end)` of device buffer `b` that `layers` moves (empty when the buffer
    /// does not hold a one-layer transfer's layer).
    #[inline]
    pub fn range(&self, b: usize, layers: Layers) -> (u64, u64) {
        match layers {
            Layers::All => (0, self.buffers.get(b).map_or(0, |(l, _)| *l)),
            Layers::One(l) => match self.index(b, l) {
                Some(i) => (i, i + 1),
                None => (0, 0),
            },
        }
    }

    /// Some buffer holds the layer a one-layer transfer names.
    ///
    /// # Errors
    /// [`TransferError::Layer`] (an index past the deepest buffer) or
    /// [`TransferError::ModelLayer`] (a model layer id no buffer serves).
    #[inline]
    pub fn check(&self, layers: Layers) -> Result<(), TransferError> {
        let Layers::One(layer) = layers else {
            return Ok(());
        };
        if !self.model_ids {
            return crate::shim::check_layer(layers, self.deepest_layers);
        }
        if (0..self.buffers.len()).any(|b| self.index(b, layer).is_some()) {
            return Ok(());
        }
        Err(self.unserved(layer))
    }

    #[cold]
    #[inline(never)]
    fn unserved(&self, layer: u64) -> TransferError {
        let mut served: Vec<u64> = self
            .buffers
            .iter()
            .flat_map(|(layers, ids)| match ids {
                Some(ids) => ids.iter().map(|&i| u64::from(i)).collect::<Vec<_>>(),
                None => (0..*layers).collect(),
            })
            .collect();
        served.sort_unstable();
        served.dedup();
        TransferError::ModelLayer {
            layer,
            served: served.len() as u64,
            first: served.first().copied().unwrap_or(0),
            last: served.last().copied().unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use kvlayout_core::{BufferGeometry, MemoryLayout, formats};

    use super::*;

    /// `full` serves model layers 1 and 3, `swa` 0 and 2, `state` (no ids) indices 0 and 1.
    fn hybrid(ids: bool) -> PoolGeometry {
        let mut full = BufferGeometry::new("full", 2, formats::MHA_BF16_8X128);
        let mut swa = BufferGeometry::new("swa", 2, formats::MHA_BF16_8X128);
        if ids {
            full = full.with_layer_ids(vec![1, 3]);
            swa = swa.with_layer_ids(vec![0, 2]);
        }
        PoolGeometry {
            name: "hybrid".into(),
            page_size_tokens: 16,
            pages: 4,
            memory_layout: MemoryLayout::LayerFirst,
            buffers: vec![
                full,
                swa,
                BufferGeometry::new("state", 2, formats::MLA_BF16),
            ],
        }
    }

    #[test]
    fn a_model_layer_id_names_its_position_in_each_buffer() {
        let m = LayerMap::new(&hybrid(true), &hybrid(true));
        // model layer 3: full's second entry; swa does not serve it; state has no index 3
        assert_eq!(
            (0..3)
                .map(|b| m.range(b, Layers::One(3)))
                .collect::<Vec<_>>(),
            vec![(1, 2), (0, 0), (0, 0)]
        );
        // model layer 0: swa's first entry and the state buffer's index 0
        assert_eq!(
            (0..3).map(|b| m.index(b, 0)).collect::<Vec<_>>(),
            vec![None, Some(0), Some(0)]
        );
        assert_eq!(
            m.check(Layers::One(4)).unwrap_err().to_string(),
            "layer 4: no buffer serves model layer 4 (the buffers' layer_ids cover 4 layers, 0..=3)"
        );
    }

    #[test]
    fn ids_on_the_host_only_still_name_model_layers() {
        let m = LayerMap::new(&hybrid(false), &hybrid(true));
        assert!(m.model_ids());
        assert_eq!(m.range(0, Layers::One(3)), (1, 2));
        let plain = LayerMap::new(&hybrid(false), &hybrid(false));
        assert_eq!(plain.range(0, Layers::One(1)), (1, 2));
        assert_eq!(
            plain.check(Layers::One(2)).unwrap_err().to_string(),
            "layer 2 out of range (the deepest buffer has 2 layers)"
        );
    }
}
