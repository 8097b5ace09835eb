/* xmoe's C ABI: the MoE layer and the generation engine for language bindings (the Python package uses it).
 *
 * Tensors cross as DLPack (dlpack/dlpack.h, Debian libdlpack-dev): inputs are DLTensor views of the caller's
 * memory, never copied; outputs are DLManagedTensor the caller releases with their deleter. Only contiguous
 * CPU tensors of float32, float64 and bfloat16 are accepted.
 *
 * Errors: every function returning int returns 0 on success, or -1 with a message (naming the argument that
 * is wrong) kept for xmoe_last_error() on the calling thread. A failed call leaves the object usable. */
#ifndef XMOE_C_API_H
#define XMOE_C_API_H

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XMOE_C_API_VERSION 2

int32_t xmoe_c_api_version(void);
/* The message of the last failed call on this thread ("" if none). */
const char* xmoe_last_error(void);

/* ---------------------------------------------------------------------------------------------------------
 * The MoE layer (Tutel semantics; include/xmoe/moe_layer.hpp)
 * ------------------------------------------------------------------------------------------------------- */
typedef struct xmoe_layer xmoe_layer;

typedef struct xmoe_layer_config {
  const char* gate_type; /* "top" | "cosine_top" */
  int32_t k;
  double capacity_factor; /* > 0 padded, 0 dropless, < 0 capped dropless */
  double gate_noise;
  int32_t fp32_gate;
  int64_t proj_dim; /* cosine_top */
  double init_t;    /* cosine_top */
  int64_t model_dim;
  const char* expert_type; /* "ffn" | "swiglu" */
  int32_t num_experts;     /* global E */
  int64_t hidden_size;
  int64_t output_dim;     /* ffn; 0 = model_dim */
  const char* activation; /* ffn: relu | gelu | silu | identity */
  int32_t has_fc1_bias, has_fc2_bias;
  DLDataType dtype;
  int32_t is_postscore, batch_prioritized_routing, normalize_gate, is_gshard_loss;
  int64_t capacity_alignment;
  uint64_t seed_gate, seed_experts;
  const char* isa; /* kernel level cap; NULL or "" = the best this CPU runs */
  /* Expert parallelism (layers created in a group of more than one rank; see xmoe_layer_create_in_group) */
  int32_t adaptive_r;         /* the default r: 1 expert parallel, 0 data parallel, a divisor of the shards */
  int32_t a2a_overlap_degree; /* the default overlap degree D (capacity chunks whose all-to-all overlaps) */
  int32_t use_2dh;            /* hierarchical (intra-node, then inter-node) all-to-all */
  int32_t local_size;         /* ranks per node for use_2dh; 0 = the LOCAL_SIZE environment variable */
} xmoe_layer_config;

/* MoeConfig's defaults (top gate k=2, ffn relu with biases, float32, ...); model_dim, num_experts and
 * hidden_size still need setting. */
void xmoe_layer_config_init(xmoe_layer_config* config);
int xmoe_layer_create(const xmoe_layer_config* config, xmoe_layer** out);
typedef struct xmoe_comm xmoe_comm;
/* A layer whose experts are split over `group` (NULL or a group of one rank: the single-process layer): E =
 * num_experts global experts, E / W held by each rank, or, when W is a multiple of E, each expert's hidden
 * dimension split over W / E ranks. Collective over the group; forward and backward are then collective too
 * (every rank calls them, with its own tokens). The layer keeps the group alive. */
int xmoe_layer_create_in_group(const xmoe_layer_config* config, xmoe_comm* group, xmoe_layer** out);
void xmoe_layer_destroy(xmoe_layer* layer);

int64_t xmoe_layer_num_params(const xmoe_layer* layer);
int64_t xmoe_layer_output_dim(const xmoe_layer* layer);
const char* xmoe_layer_kernel_isa(const xmoe_layer* layer);
/* Parameter i: its name ("gate.wg", "experts.batched_fc1_w", ...), whether it is an expert parameter, and a
 * view of its current value (valid until the parameter is rebound or the layer destroyed). */
int xmoe_layer_param(xmoe_layer* layer, int64_t i, const char** name, int32_t* is_expert, DLTensor* value);
/* Makes parameter i read its value from `value` (same dtype and shape) and accumulate its gradient into
 * `grad` (float64 for float64 layers, float32 otherwise; same shape). Either may be NULL to keep the current
 * binding. The memory stays the caller's: it must outlive every forward/backward that uses it. */
int xmoe_layer_bind_param(xmoe_layer* layer, int64_t i, const DLTensor* value, const DLTensor* grad);

typedef struct xmoe_switches {
  int32_t top_k;               /* 0: the gate's k */
  int32_t has_capacity_factor; /* 0: the gate's capacity factor */
  double capacity_factor;
  int32_t grouped;            /* 1: dropless grouped (MegaBlocks-like) expert execution */
  int32_t training;           /* gate noise applies only in training */
  const DLTensor* noise;      /* NULL, or [T, E] N(0,1) draws used for the gate noise */
  int32_t adaptive_r;         /* -1: the layer's */
  int32_t a2a_overlap_degree; /* 0: the layer's */
} xmoe_switches;

void xmoe_switches_init(xmoe_switches* switches); /* every switch at "the layer's" */

/* y = layer(x) for x [..., model_dim] in any of the three dtypes (converted to the layer's). x must stay
 * alive and unchanged until the matching backward. *y is the layer's dtype, shape x's leading dims +
 * [output_dim]. */
int xmoe_layer_forward(xmoe_layer* layer, const DLTensor* x, const xmoe_switches* switches,
                       DLManagedTensor** y, double* l_aux);
/* Backward of the last forward: *dx (the layer's dtype, x's shape); parameter gradients are accumulated into
 * the bound gradient memory; daux scales the gradient of l_aux. */
int xmoe_layer_backward(xmoe_layer* layer, const DLTensor* dy, double daux, DLManagedTensor** dx);

/* Fills a float32/float64/bfloat16 tensor with N(0,1) draws of xmoe's counter-based generator: element i gets
 * draw i of stream `stream` under `seed` (what `xmoe bench --seed S` feeds rank `stream`). */
int xmoe_fill_normal(uint64_t seed, uint64_t stream, DLTensor* out);

/* ---------------------------------------------------------------------------------------------------------
 * Communicators for expert parallelism (include/xmoe/communicator.hpp, xmoe/mpi.hpp)
 *
 * MPI is initialised by at most one session per process: MPI_Init_thread(MPI_THREAD_FUNNELED), so every
 * collective must come from the thread that created the session. If MPI was already initialised (mpi4py),
 * the session adopts it and leaves finalising to its owner. Destroying the session calls MPI_Finalize; the
 * communicators and layers still alive then stay safe to destroy (they no longer touch MPI) but not to use.
 * Every collective waits at most XMOE_COMM_TIMEOUT_S seconds (default 300), then ends the job naming the
 * collective.
 * ------------------------------------------------------------------------------------------------------- */
typedef struct xmoe_mpi_session xmoe_mpi_session;

int32_t xmoe_mpi_available(void); /* 1 when xmoe was built with MPI */
int xmoe_mpi_session_create(xmoe_mpi_session** out);
void xmoe_mpi_session_destroy(xmoe_mpi_session* session);
/* Every process of the job (a duplicate of MPI_COMM_WORLD). Collective over MPI_COMM_WORLD. */
int xmoe_mpi_session_world(xmoe_mpi_session* session, xmoe_comm** out);

int32_t xmoe_comm_rank(const xmoe_comm* comm);
int32_t xmoe_comm_size(const xmoe_comm* comm);
const char* xmoe_comm_name(const xmoe_comm* comm);
/* Ranks with the same color (>= 0) form a group, ordered by key (then by rank). Collective over `comm`. */
int xmoe_comm_split(xmoe_comm* comm, int32_t color, int32_t key, xmoe_comm** out);
void xmoe_comm_destroy(xmoe_comm* comm);
/* In place over a contiguous CPU tensor: op "sum" | "max" | "min"; float32, float64, int32 or int64. */
int xmoe_comm_all_reduce(xmoe_comm* comm, DLTensor* data, const char* op);
int xmoe_comm_broadcast(xmoe_comm* comm, DLTensor* data, int32_t root);
int xmoe_comm_barrier(xmoe_comm* comm);

/* ---------------------------------------------------------------------------------------------------------
 * The generation engine (`xmoe generate`)
 * ------------------------------------------------------------------------------------------------------- */
typedef struct xmoe_llm xmoe_llm;
typedef struct xmoe_generations xmoe_generations;

/* Opens a Hugging Face checkpoint directory and loads its weights (dtype "bf16" or "f32"; isa may be NULL).
 */
int xmoe_llm_open(const char* model_dir, const char* dtype, const char* isa, xmoe_llm** out);
void xmoe_llm_destroy(xmoe_llm* llm);

typedef struct xmoe_generation_request {
  const char* prompt;        /* text (tokenized with the checkpoint's tokenizer), or NULL to use prompt_ids */
  const int32_t* prompt_ids; /* token ids when prompt is NULL */
  int64_t num_prompt_ids;
  int64_t max_tokens;
  int32_t has_temperature; /* 0: generation_config.json's (else 1.0) */
  double temperature;      /* 0 = greedy */
  int32_t has_seed;
  uint64_t seed;
  int32_t ignore_eos;
} xmoe_generation_request;

void xmoe_generation_request_init(xmoe_generation_request* request);
/* Decodes all requests together (continuous batching); results in request order. */
int xmoe_llm_generate(xmoe_llm* llm, const xmoe_generation_request* requests, int64_t count,
                      xmoe_generations** out);
int64_t xmoe_generations_count(const xmoe_generations* g);
const int32_t* xmoe_generations_ids(const xmoe_generations* g, int64_t i, int64_t* count);
const char* xmoe_generations_text(const xmoe_generations* g, int64_t i, size_t* length); /* UTF-8 */
const char* xmoe_generations_finish_reason(const xmoe_generations* g, int64_t i); /* "stop" | "length" */
void xmoe_generations_destroy(xmoe_generations* g);

#ifdef __cplusplus
}
#endif

#endif /* XMOE_C_API_H */
