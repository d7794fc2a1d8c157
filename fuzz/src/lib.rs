//! Helpers shared by the fuzz targets: the schemas and input plans the product reads, and an
//! in-memory checkpoint [`Storage`] so file readers run without touching the disk.

use std::collections::BTreeMap;
use std::io::{Cursor, Read, Write};
use std::sync::Arc;

use parking_lot::Mutex;
use sparta_checkpoint::{BlobInfo, BlobWriter, CheckpointError, Storage};
use sparta_data::features::{DenseInput, DenseTransform, InputPlan, Pooling, Slot, SlotKind};
use sparta_data::{rich_schema, Column, ColumnKind, Schema};

/// A schema with the plan a job would run it with, and the tag of every slot.
pub struct Layout {
    /// Short name (seed file names, messages).
    pub name: &'static str,
    /// Column layout.
    pub schema: Schema,
    /// What the lines become.
    pub plan: InputPlan,
}

impl Layout {
    /// The tag of every slot, in field order.
    pub fn tags(&self) -> Vec<u8> {
        self.plan.slots.iter().map(|s| s.tag).collect()
    }
}

/// Every schema kind the product reads: Criteo, Avazu, a generic named-column schema with a
/// legacy multi-sparse bag and ignored columns, the rich plan of `examples/rich.toml` (ids,
/// a weighted bag, a sequence, buckets, a dense input) and a wide schema (more columns than
/// the parser's stack buffer) with a standardized dense input.
pub fn layouts() -> Vec<Layout> {
    let legacy = |name, schema: Schema| {
        let plan = InputPlan::legacy(&schema);
        Layout { name, schema, plan }
    };
    let generic = Schema {
        columns: vec![
            Column::new("ts", ColumnKind::Ignore),
            Column::new("clicked", ColumnKind::Label),
            Column::new("price", ColumnKind::Dense),
            Column::new("user", ColumnKind::Sparse),
            Column::new("tags", ColumnKind::MultiSparse { separator: ';' }),
            Column::new("ad", ColumnKind::Sparse),
        ],
        separator: ',',
        header: true,
    };
    let rich = rich_schema();
    let rich_plan = InputPlan {
        slots: vec![
            slot("user_id", 1, 0, SlotKind::Id),
            slot("gender", 2, 4, SlotKind::Id),
            slot("item_id", 3, 1, SlotKind::Id),
            slot("item_cat", 4, 2, SlotKind::Id),
            slot(
                "tags",
                5,
                3,
                SlotKind::Bag {
                    pooling: Pooling::Mean,
                    weighted: true,
                    weight_separator: b':',
                },
            ),
            slot("hist_items", 6, 1, SlotKind::Sequence { max_len: 5 }),
            slot(
                "price_bucket",
                7,
                5,
                SlotKind::Buckets {
                    boundaries: vec![-1.0, 0.0, 1.5, 10.0, 1e6],
                },
            ),
        ],
        dense: vec![DenseInput {
            name: "price".into(),
            column: 7,
            transform: DenseTransform::Log1p,
        }],
    };
    let mut wide_columns = vec![Column::new("label", ColumnKind::Label)];
    wide_columns.extend((0..40).map(|i| Column::new(format!("d{i}"), ColumnKind::Dense)));
    wide_columns.extend((0..30).map(|i| Column::new(format!("s{i}"), ColumnKind::Sparse)));
    wide_columns.push(Column::new(
        "seq",
        ColumnKind::MultiSparse { separator: ' ' },
    ));
    let wide = Schema {
        columns: wide_columns,
        separator: '\t',
        header: false,
    };
    let mut wide_plan = InputPlan::legacy(&wide);
    wide_plan.dense[0].transform = DenseTransform::Standardize {
        mean: 3.0,
        std: 0.5,
    };
    let last = wide_plan.slots.len() - 1;
    wide_plan.slots[last].kind = SlotKind::Sequence { max_len: 3 };
    wide_plan.slots[last].tag = 200;
    let out = vec![
        legacy("criteo", Schema::criteo()),
        legacy("avazu", Schema::avazu()),
        legacy("generic", generic),
        Layout {
            name: "rich",
            schema: rich,
            plan: rich_plan,
        },
        Layout {
            name: "wide",
            schema: wide,
            plan: wide_plan,
        },
    ];
    for l in &out {
        l.schema.validate().expect("fuzz schema is valid");
        l.plan.validate(&l.schema).expect("fuzz plan is valid");
    }
    out
}

fn slot(name: &str, column: usize, tag: u8, kind: SlotKind) -> Slot {
    Slot {
        name: name.into(),
        column,
        tag,
        kind,
    }
}

/// Checkpoint storage in memory: blobs by name.
#[derive(Debug, Default, Clone)]
pub struct MemStorage {
    blobs: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
}

impl MemStorage {
    /// A copy whose blobs can be changed without touching this one's.
    pub fn deep_clone(&self) -> MemStorage {
        MemStorage {
            blobs: Arc::new(Mutex::new(self.blobs.lock().clone())),
        }
    }

    /// Every blob name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.blobs.lock().keys().cloned().collect()
    }

    /// Replaces (or adds) a blob.
    pub fn set(&self, name: &str, data: Vec<u8>) {
        self.blobs.lock().insert(name.to_string(), data);
    }

    /// A blob's bytes.
    pub fn bytes(&self, name: &str) -> Option<Vec<u8>> {
        self.blobs.lock().get(name).cloned()
    }
}

struct MemWriter {
    name: String,
    buf: Vec<u8>,
    blobs: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
}

impl Write for MemWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl BlobWriter for MemWriter {
    fn finish(self: Box<Self>) -> Result<(), CheckpointError> {
        self.blobs.lock().insert(self.name, self.buf);
        Ok(())
    }
}

impl Storage for MemStorage {
    fn create(&self, name: &str) -> Result<Box<dyn BlobWriter + '_>, CheckpointError> {
        Ok(Box::new(MemWriter {
            name: name.to_string(),
            buf: Vec::new(),
            blobs: Arc::clone(&self.blobs),
        }))
    }

    fn open(&self, name: &str) -> Result<(Box<dyn Read + Send + '_>, u64), CheckpointError> {
        let data = self
            .blobs
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| CheckpointError::NotFound(name.to_string()))?;
        let len = data.len() as u64;
        Ok((Box::new(Cursor::new(data)), len))
    }

    fn list(&self, prefix: &str) -> Result<Vec<BlobInfo>, CheckpointError> {
        Ok(self
            .blobs
            .lock()
            .iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .map(|(n, d)| BlobInfo {
                name: n.clone(),
                size: d.len() as u64,
            })
            .collect())
    }

    fn delete(&self, name: &str) -> Result<(), CheckpointError> {
        self.blobs.lock().remove(name);
        Ok(())
    }

    fn location(&self) -> String {
        "memory".into()
    }
}

/// How a target changes a valid file with its fuzz bytes (see [`mutate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edit {
    /// The fuzz bytes are the whole new content.
    Replace,
    /// The content is cut where the first fuzz byte says (in 256ths), the rest appended.
    CutAndAppend,
    /// The fuzz bytes are patches: `(offset u16 LE, xor byte)` triples.
    Patch,
    /// The content is cut where the first two fuzz bytes say (u16 LE).
    Truncate,
}

impl Edit {
    /// The edit picked by two bits.
    pub fn from_bits(b: u8) -> Edit {
        match b & 3 {
            0 => Edit::Replace,
            1 => Edit::CutAndAppend,
            2 => Edit::Patch,
            _ => Edit::Truncate,
        }
    }
}

/// `original` changed by `edit` with the fuzz bytes `fuzz`.
pub fn mutate(original: &[u8], edit: Edit, fuzz: &[u8]) -> Vec<u8> {
    match edit {
        Edit::Replace => fuzz.to_vec(),
        Edit::CutAndAppend => {
            let at = fuzz
                .first()
                .map_or(0, |&x| x as usize * original.len() / 256);
            let mut b = original[..at].to_vec();
            b.extend_from_slice(fuzz.get(1..).unwrap_or_default());
            b
        }
        Edit::Patch => {
            let mut b = original.to_vec();
            if !b.is_empty() {
                for p in fuzz.chunks_exact(3) {
                    let at = u16::from_le_bytes([p[0], p[1]]) as usize % b.len();
                    b[at] ^= p[2];
                }
            }
            b
        }
        Edit::Truncate => {
            let at = match fuzz {
                [a, b, ..] => u16::from_le_bytes([*a, *b]) as usize,
                [a] => *a as usize,
                [] => 0,
            };
            original[..at.min(original.len())].to_vec()
        }
    }
}

/// The payload of a checkpoint-envelope file (between the 16-byte header and the 24-byte
/// footer of `sparta_checkpoint::format`); empty when the file is shorter than both.
pub fn payload_of(file: &[u8]) -> &[u8] {
    let (h, f) = (
        sparta_checkpoint::format::HEADER_LEN as usize,
        sparta_checkpoint::format::FOOTER_LEN as usize,
    );
    if file.len() < h + f {
        return &[];
    }
    &file[h..file.len() - f]
}
