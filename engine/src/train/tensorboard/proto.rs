//! The few TensorBoard protobuf messages `--tensorboard` writes (`tensorboard.Event` and what a scalar
//! or a text summary needs), derived by hand with prost: no `protoc`, no build script.
//!
//! Field numbers and oneofs are those of TensorBoard's `event.proto`, `summary.proto`, `tensor.proto`
//! and `tensor_shape.proto` (read from the `tensorboard` package's generated descriptors). Fields we
//! never write are left out; a protobuf reader skips nothing it expects, so readers see the same
//! messages TensorFlow's writers produce for these summaries.

/// `tensorboard.Event`: one record of an event file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// Seconds since the Unix epoch when the event was written.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// The training step the event belongs to.
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(oneof = "What", tags = "3, 5, 7")]
    pub what: Option<What>,
}

/// The `what` oneof of [`Event`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum What {
    /// The first event of every file: "brain.Event:2".
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
    #[prost(message, tag = "7")]
    SessionLog(SessionLog),
}

/// `tensorboard.SessionLog`: START tells readers that a run (re)started at the event's step, so data
/// an earlier, interrupted run wrote for later steps is stale.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SessionLog {
    #[prost(int32, tag = "1")]
    pub status: i32,
}

/// `SessionLog.SessionStatus.START`.
pub const SESSION_START: i32 = 1;

/// `tensorboard.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<Value>,
}

/// `tensorboard.Summary.Value`: one tagged scalar or tensor.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(message, optional, tag = "9")]
    pub metadata: Option<SummaryMetadata>,
    /// A oneof, so that a scalar of 0.0 is still written (a plain proto3 float would be left out).
    #[prost(oneof = "Data", tags = "2, 8")]
    pub data: Option<Data>,
}

/// The `value` oneof of [`Value`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Data {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
    #[prost(message, tag = "8")]
    Tensor(TensorProto),
}

/// `tensorboard.SummaryMetadata`: which plugin shows the value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    pub plugin_data: Option<PluginData>,
}

/// `tensorboard.SummaryMetadata.PluginData`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginData {
    #[prost(string, tag = "1")]
    pub plugin_name: String,
}

/// `tensorboard.TensorProto`, only as much as a string scalar needs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// A `tensorboard.DataType` ([`DT_STRING`] here).
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    /// No dimensions: a scalar. Present (if empty) as TensorFlow writes it.
    #[prost(message, optional, tag = "2")]
    pub tensor_shape: Option<TensorShapeProto>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    pub string_val: Vec<Vec<u8>>,
}

/// `DataType.DT_STRING`.
pub const DT_STRING: i32 = 7;

/// `tensorboard.TensorShapeProto` with no dimensions (a scalar's shape).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {}

impl Value {
    /// A scalar for the scalars dashboard.
    pub fn scalar(tag: &str, value: f32) -> Value {
        Value { tag: tag.to_string(), metadata: None, data: Some(Data::SimpleValue(value)) }
    }

    /// A text for the text dashboard (its plugin renders Markdown).
    pub fn text(tag: &str, text: &str) -> Value {
        let tensor = TensorProto { dtype: DT_STRING, tensor_shape: Some(TensorShapeProto {}), string_val: vec![text.as_bytes().to_vec()] };
        let metadata = SummaryMetadata { plugin_data: Some(PluginData { plugin_name: "text".into() }) };
        Value { tag: tag.to_string(), metadata: Some(metadata), data: Some(Data::Tensor(tensor)) }
    }
}
