// The `transmuter` command-line tool: info, run, bench, conformance, download, cache, tokenize, chat,
// embed, classify, ner, fill-mask, generate.
// The contract is in DESIGN.md ("The command-line contract").
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include <mlx/mlx.h>

#include "cli.h"
#include "node_inspection.h"
#include "npy.h"
#include "transmuter/transmuter.h"

namespace fs = std::filesystem;
namespace mx = mlx::core;
using namespace transmuter;

namespace transmuter::cli {

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = options.find(name);
  return it == options.end() ? fallback : it->second;
}

std::vector<std::string> Args::all(const std::string& name) const {
  std::vector<std::string> out;
  for (auto [it, end] = options.equal_range(name); it != end; ++it) out.push_back(it->second);
  return out;
}

int Args::get_int(const std::string& name, int fallback) const {
  std::string v = get(name, "");
  if (v.empty()) return fallback;
  try {
    return std::stoi(v);
  } catch (const std::exception&) {
    throw Error(str("--", name, " expects a number, got '", v, "'"));
  }
}

}  // namespace transmuter::cli

namespace {

using cli::Args;
using cli::NodePerturbation;
using cli::ValueDump;

// Options that take no value; they parse as "--name true".
bool is_flag(const std::string& name) {
  return name == "quiet" || name == "revisions" || name == "no-special-tokens" || name == "render" ||
         name == "add-generation-prompt" || name == "normalize" || name == "no-normalize" || name == "reject-long" ||
         name == "no-ignore" || name == "do-sample" || name == "jsonl" || name == "no-skip";
}

Args parse_args(int argc, char** argv, int first) {
  Args args;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      std::string name = a.substr(2);
      if (is_flag(name)) {
        args.options.emplace(name, "true");
        continue;
      }
      if (i + 1 >= argc) throw Error(str("option --", name, " needs a value"));
      args.options.emplace(name, argv[++i]);
    } else {
      args.positional.push_back(a);
    }
  }
  return args;
}

std::pair<std::string, std::string> split_assignment(const std::string& text, const std::string& option) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) throw Error(str("--", option, " expects NAME=VALUE, got '", text, "'"));
  return {text.substr(0, eq), text.substr(eq + 1)};
}

std::string shape_text(const ValueInfo& info) {
  if (!info.has_shape) return "[?]";
  std::string out = "[";
  for (size_t i = 0; i < info.shape.size(); ++i) {
    const Dim& d = info.shape[i];
    out += (i ? ", " : "") + (d.value ? std::to_string(*d.value) : (d.symbol.empty() ? "?" : d.symbol));
  }
  return out + "]";
}

std::string kind_text(const ValueInfo& info) {
  switch (info.kind) {
    case ValueInfo::Kind::kTensor: return onnx_type_name(info.elem_type);
    case ValueInfo::Kind::kSequence: return "sequence<" + onnx_type_name(info.elem_type) + ">";
    case ValueInfo::Kind::kOptional: return "optional<" + onnx_type_name(info.elem_type) + ">";
    case ValueInfo::Kind::kMap: return "map";
    case ValueInfo::Kind::kUnknown: break;
  }
  return "?";
}

// --passes default|none|NAME[,NAME...]: the load-time rewrites on (default),
// off, or only the named ones, to compare. --compute-type auto|float32|model:
// what a float16/bfloat16 model computes in (LoadOptions::compute_type).
LoadOptions parse_load_options(const Args& args) {
  const std::string passes = args.get("passes", "default");
  LoadOptions options;
  options.dtype = args.get("dtype", "fp32");
  options.hub = cli::hub_options(args);
  options.run_passes = passes != "none";
  const std::string compute = args.get("compute-type", "auto");
  if (compute == "float32") options.compute_type = ComputeType::kFloat32;
  else if (compute == "model") options.compute_type = ComputeType::kModel;
  else if (compute != "auto") throw Error("--compute-type expects auto, float32 or model, got '" + compute + "'");
  if (passes == "default" || passes == "none") return options;
  std::stringstream names(passes);
  for (std::string name; std::getline(names, name, ',');) {
    if (!name.empty()) options.only_passes.push_back(name);
  }
  if (options.only_passes.empty()) throw Error("--passes expects default, none or pass names, got '" + passes + "'");
  return options;
}

int info_main(const Args& args) {
  if (args.positional.size() != 1) throw Error("usage: transmuter info MODEL");
  auto t0 = std::chrono::steady_clock::now();
  Model model = load(args.positional[0], parse_load_options(args));
  double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "model: " << args.positional[0] << "\n";
  std::cout << "ir_version: " << model.ir_version() << "  producer: " << model.producer() << "\n";
  std::cout << "opsets:";
  for (const auto& [domain, version] : model.opsets()) std::cout << " " << (domain.empty() ? "ai.onnx" : domain) << "=" << version;
  std::cout << "\ninputs:\n";
  for (const ValueInfo& in : model.inputs()) std::cout << "  " << in.name << ": " << kind_text(in) << " " << shape_text(in) << "\n";
  std::cout << "outputs:\n";
  for (const ValueInfo& out : model.outputs()) std::cout << "  " << out.name << ": " << kind_text(out) << " " << shape_text(out) << "\n";
  size_t bytes = 0;
  for (const auto& [name, a] : model.params()) bytes += a.nbytes();
  std::map<std::string, size_t> histogram = model.op_histogram();
  std::cout << "params: " << model.params().size() << " tensors, " << bytes << " bytes\n";
  std::cout << "nodes: " << model.node_count() << " (";
  bool first = true;
  for (const auto& [op, count] : histogram) {
    std::cout << (first ? "" : ", ") << op << " " << count;
    first = false;
  }
  std::cout << ")\nload_ms: " << load_ms << "\n";
  return 0;
}

uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  uint64_t bytes = 0;
  if (pages <= 0 || page_size <= 0 ||
      __builtin_mul_overflow(static_cast<uint64_t>(pages), static_cast<uint64_t>(page_size), &bytes)) {
    return std::numeric_limits<uint64_t>::max();
  }
  return bytes;
}

// The shape to fill: declared dims, `--dim` values for symbolic ones, else 1.
// Refuses what MLX cannot hold (int32 dims) and what cannot fit in memory:
// a failed allocation inside MLX is a crash, not an exception.
mx::Shape fill_shape(const ValueInfo& info, const std::map<std::string, int64_t>& dims, mx::Dtype dtype) {
  mx::Shape shape;
  uint64_t count = 1;
  bool overflow = false;
  for (size_t i = 0; i < info.shape.size(); ++i) {
    const Dim& d = info.shape[i];
    auto given = dims.find(d.symbol);
    const int64_t value = d.value ? *d.value : (given == dims.end() ? 1 : given->second);
    if (value < 0 || value > std::numeric_limits<int32_t>::max()) {
      throw InputError(str("input '", info.name, "': dimension ", i, " is ", value, " (shape ",
                           shape_text(info),
                           "), outside the int32 range of MLX shapes; it cannot be filled at random"));
    }
    shape.push_back(static_cast<int32_t>(value));
    overflow |= __builtin_mul_overflow(count, static_cast<uint64_t>(value), &count);
  }
  uint64_t bytes = 0;
  overflow |= __builtin_mul_overflow(count, static_cast<uint64_t>(mx::size_of(dtype)), &bytes);
  const uint64_t memory = physical_memory_bytes();
  if (overflow || bytes > memory) {
    throw InputError(str("input '", info.name, "': filling shape ", shape_text(info), " at random needs ",
                         overflow ? std::string("more than 2^64") : std::to_string(bytes),
                         " bytes, more than this machine's physical memory (", memory,
                         " bytes); pass --input, or --dim for symbolic dimensions"));
  }
  return shape;
}

// Seeded random values of the declared dtype and shape for inputs not given.
mx::array random_input(const ValueInfo& info, const std::map<std::string, int64_t>& dims, uint64_t seed) {
  auto dtype = to_mlx_dtype(info.elem_type);
  if (info.kind != ValueInfo::Kind::kTensor || !dtype) {
    throw InputError(str("input '", info.name, "' (", kind_text(info), ") cannot be filled at random; pass --input"));
  }
  const mx::Shape shape = fill_shape(info, dims, *dtype);
  mx::array key = mx::random::key(seed);
  if (mx::issubdtype(*dtype, mx::floating)) return mx::astype(mx::random::normal(shape, mx::float32, 0, 1, key), *dtype);
  if (*dtype == mx::bool_) return mx::random::bernoulli(mx::array(0.5f), shape, key);
  // Small non-negative integers: valid token ids, indices and masks for most models.
  return mx::astype(mx::random::randint(0, 2, shape, mx::int32, key), *dtype);
}

struct PreparedInputs {
  Inputs inputs;
  std::vector<std::string> static_names;
};

PreparedInputs prepare_inputs(const Model& model, const Args& args) {
  PreparedInputs prepared;
  std::map<std::string, int64_t> dims;
  for (const std::string& d : args.all("dim")) {
    auto [name, value] = split_assignment(d, "dim");
    int64_t number = -1;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
    if (ec != std::errc() || end != value.data() + value.size() || number < 0) {
      throw Error(str("--dim ", name, ": expects a non-negative integer, got '", value, "'"));
    }
    dims[name] = number;
  }
  for (const std::string& opt : {std::string("input"), std::string("static")}) {
    for (const std::string& spec : args.all(opt)) {
      auto [name, file] = split_assignment(spec, opt);
      prepared.inputs[name] = read_npy(file);
      if (opt == "static") prepared.static_names.push_back(name);
    }
  }
  uint64_t seed = static_cast<uint64_t>(args.get_int("seed", 0));
  for (const ValueInfo& in : model.inputs()) {
    if (prepared.inputs.count(in.name) == 0 && in.kind != ValueInfo::Kind::kOptional) {
      prepared.inputs[in.name] = random_input(in, dims, seed++);
    }
  }
  return prepared;
}

mx::Device parse_device(const Args& args) {
  std::string d = args.get("device", "");
  if (d.empty()) return default_device();
  if (d == "cpu") return mx::Device::cpu;
  if (d == "gpu") {
    if (!mx::is_available(mx::Device::gpu)) throw Error("--device gpu: MLX has no GPU on this machine");
    return mx::Device::gpu;
  }
  throw Error(str("--device expects cpu or gpu, got '", d, "'"));
}

std::string parse_mode(const Args& args) {
  std::string mode = args.get("mode", "eager");
  if (mode != "eager" && mode != "compiled") throw Error(str("--mode expects eager or compiled, got '", mode, "'"));
  return mode;
}

// The model of `run` and `bench`. A compiled run starts MLX's one check of the system compiler first
// (prepare_to_compile), so that the load hides it instead of the first call waiting for it.
Model load_to_run(const Args& args) {
  if (parse_mode(args) == "compiled") prepare_to_compile();
  return load(args.positional[0], parse_load_options(args));
}

std::string sanitize(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  }
  return out;
}

void eval_outputs(const Outputs& outputs) {
  std::vector<mx::array> arrays;
  for (const Value& v : outputs.values) {
    if (v.is_tensor()) arrays.push_back(v.tensor());
  }
  mx::eval(arrays);
}

// A callable that runs the model once in the chosen mode.
struct Runner {
  std::function<Outputs()> run_once;
  std::shared_ptr<CompiledModel> compiled;  // null in eager mode
};

// --eval-lookahead / --kernel-lookahead MIB: how far MLX, and Transmuter's kernels,
// may allocate ahead of the computation on the CPU (RunOptions::cpu_eval_lookahead,
// cpu_kernel_lookahead); unset keeps the library's default.
std::optional<size_t> parse_mib(const Args& args, const std::string& name) {
  if (!args.has(name)) return std::nullopt;
  const int mib = args.get_int(name, -1);
  if (mib < 0) throw Error(str("--", name, " expects a number of MiB >= 0"));
  return static_cast<size_t>(mib) << 20;
}

Runner make_runner(const Model& model, const PreparedInputs& prepared, const Args& args,
                   NodeHook hook = nullptr) {
  mx::Device device = parse_device(args);
  const std::optional<size_t> lookahead = parse_mib(args, "eval-lookahead");
  const std::optional<size_t> kernel_lookahead = parse_mib(args, "kernel-lookahead");
  // --direct: compiled CPU segments run as recorded kernel lists, eager CPU outputs are evaluated on the
  // calling thread (off: MLX's scheduler evaluates both).
  const std::string direct = args.get("direct", "on");
  if (direct != "on" && direct != "off") throw Error(str("--direct expects on or off, got '", direct, "'"));
  if (parse_mode(args) == "eager") {
    RunOptions options;
    options.evaluate_cpu_outputs = direct == "on";
    options.device = device;
    options.cpu_eval_lookahead = lookahead;
    options.cpu_kernel_lookahead = kernel_lookahead;
    options.node_hook = std::move(hook);
    return {[model, prepared, options]() { return run(model, model.params(), prepared.inputs, options); },
            nullptr};
  }
  if (hook) throw Error("--dump-all and --perturb-node need --mode eager: compiled plans run no node hooks");
  CompileOptions options;
  options.static_inputs = prepared.static_names;
  options.device = device;
  options.cpu_eval_lookahead = lookahead;
  options.cpu_kernel_lookahead = kernel_lookahead;
  options.direct_cpu_runs = direct == "on";
  const std::string fuse = args.get("fuse", "auto");
  if (fuse == "on" || fuse == "off") {
    options.fuse_elementwise = fuse == "on";
  } else if (fuse != "auto") {
    throw Error(str("--fuse expects on, off or auto, got '", fuse, "'"));
  }
  auto compiled = std::make_shared<CompiledModel>(compile(model, {}, options));
  return {[compiled, prepared]() { return (*compiled)(prepared.inputs); }, compiled};
}

void print_compile_stats(const Runner& runner) {
  if (!runner.compiled) return;
  const CompileStats& s = runner.compiled->stats();
  std::cerr << "compiled: " << s.segments << " segment(s), " << s.graph_breaks << " graph break(s), "
            << s.plans_built << " plan(s) built, " << s.cache_hits << " cache hit(s), " << s.direct_segments
            << " run directly";
  if (!s.direct_blockers.empty()) {
    std::cerr << " (kept off direct runs by MLX's";
    for (const std::string& name : s.direct_blockers) std::cerr << ' ' << name;
    std::cerr << ')';
  }
  std::cerr << '\n';
}

int run_main(const Args& args) {
  if (args.positional.size() != 1) throw Error("usage: transmuter run MODEL [--input NAME=FILE.npy]... [--output-dir DIR]");
  Model model = load_to_run(args);
  PreparedInputs prepared = prepare_inputs(model, args);
  // Debugging hooks, in this order: the dump shows the perturbed values.
  std::optional<NodePerturbation> perturbation;
  if (args.has("perturb-node")) perturbation.emplace(args.get("perturb-node", ""));
  std::optional<ValueDump> dump;
  if (args.has("dump-all")) dump.emplace(args.get("dump-all", ""));
  NodeHook hook;
  if (perturbation || dump) {
    hook = [&](NodeRun& node) {
      if (perturbation) (*perturbation)(node);
      if (dump) (*dump)(node);
    };
  }
  Runner runner = make_runner(model, prepared, args, hook);
  Outputs outputs = runner.run_once();
  eval_outputs(outputs);
  print_compile_stats(runner);
  if (perturbation) perturbation->finish();
  if (dump) dump->finish();
  fs::path dir = args.get("output-dir", ".");
  fs::create_directories(dir);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Value& v = outputs.values[i];
    if (!v.is_tensor()) {
      std::cout << outputs.names[i] << ": " << v.describe() << " (not written: only tensors go to .npy)\n";
      continue;
    }
    fs::path file = dir / (sanitize(outputs.names[i]) + ".npy");
    write_npy(file, v.tensor());
    std::cout << outputs.names[i] << ": " << v.describe() << " -> " << file.string() << "\n";
  }
  return 0;
}

int bench_main(const Args& args) {
  if (args.positional.size() != 1) throw Error("usage: transmuter bench MODEL [--mode eager|compiled] [--warmup N] [--runs N]");
  Model model = load_to_run(args);
  PreparedInputs prepared = prepare_inputs(model, args);
  Runner runner = make_runner(model, prepared, args);
  int warmup = args.get_int("warmup", 3), runs = std::max(1, args.get_int("runs", 10));
  // The first call pays for tracing and (compiled) MLX's kernel compilation; with an empty
  // $TRANSMUTER_KERNEL_CACHE this is the first-compile latency bench/run reports.
  double first_call_ms = -1;
  for (int i = 0; i < warmup; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    eval_outputs(runner.run_once());
    if (i == 0) first_call_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    eval_outputs(runner.run_once());
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  print_compile_stats(runner);
  std::sort(ms.begin(), ms.end());
  double mean = 0;
  for (double m : ms) mean += m / ms.size();
  std::cout << "mode: " << parse_mode(args) << "  runs: " << runs << "  warmup: " << warmup << "\n";
  if (first_call_ms >= 0) std::cout << "first_call_ms: " << first_call_ms << "\n";
  std::cout << "latency_ms: mean " << mean << "  median " << ms[ms.size() / 2] << "  min " << ms.front() << "  max " << ms.back() << "\n";
  // MLX's own accounting, for reading a peak RSS: held arrays (weights, outputs), the most
  // ever held at once, and freed buffers MLX keeps for reuse.
  constexpr double kMiB = 1024.0 * 1024.0;
  std::cout << "mlx_memory_mib: active " << mx::get_active_memory() / kMiB << "  peak "
            << mx::get_peak_memory() / kMiB << "  cache " << mx::get_cache_memory() / kMiB << "\n";
  return 0;
}

// Markdown table of every registered operator: docs/operators.md.
int operators_main() {
  std::cout << "# Operators\n\n"
               "Generated from the registry by `transmuter operators` (scripts/gen_operator_docs);\n"
               "a test fails when this file is stale. *Host inputs* are read on the host: when one is\n"
               "computed from input data, the op is a graph break under `compile`. *Eager* ops always\n"
               "run between compiled segments. *Not differentiable* says why `mx::vjp` gives no gradient\n"
               "through the op; every other op is differentiable on floating-point data (checked by\n"
               "tests/gradients/; known gaps in tests/gradients/expected_failures.txt).\n\n"
               "| Domain | Operator | Versions | Host inputs | Eager | Restrictions | Not differentiable |\n"
               "|---|---|---|---|---|---|---|\n";
  for (const OperatorInfo& op : supported_operators()) {
    std::string host;
    for (int h : op.host_inputs) host += (host.empty() ? "" : ", ") + std::to_string(h);
    std::string versions = op.open_ended ? str(op.since, "+") : str(op.since, "-", op.until);
    std::cout << "| " << op.domain << " | " << op.op_type << " | " << versions << " | " << host << " | "
              << (op.eager_only ? "yes" : "") << " | " << op.restrictions << " | " << op.not_differentiable
              << " |\n";
  }
  return 0;
}

void usage() {
  std::cerr
      << "usage:\n"
         "  transmuter info MODEL [--passes default|none|NAME,...] [--compute-type auto|float32|model]\n"
         "  transmuter run MODEL [--input NAME=FILE.npy]... [--static NAME=FILE.npy]...\n"
         "                 [--output-dir DIR] [--mode eager|compiled] [--device cpu|gpu] [--dim "
         "NAME=VALUE]... [--seed N]\n"
         "                 [--dump-all DIR]   (eager: every node's outputs as DIR/NNNNN_K.npy + "
         "DIR/index.json; see scripts/diff)\n"
         "                 [--passes default|none|NAME,...] [--fuse auto|on|off] [--direct on|off] "
         "[--compute-type "
         "auto|float32|model]\n"
         "                 [--eval-lookahead MIB] [--kernel-lookahead MIB]   (CPU memory allocated ahead of "
         "the computation)\n"
         "  transmuter bench MODEL [same inputs] [--mode eager|compiled] [--warmup N] [--runs N]\n"
         "  transmuter conformance --cases DIR [--filter REGEX] [--mode eager|compiled|both] [--json FILE]\n"
         "                 [--expected FILE] [--no-skip]\n"
         "  transmuter download hf://org/repo[@revision][/path] [--dtype "
         "fp32|fp16|q8|int8|uint8|q4|q4f16|bnb4] [--quiet]\n"
         "  transmuter cache ls [--revisions]\n"
         "  transmuter cache rm org/repo[@revision]\n"
         "  transmuter tokenize MODEL_OR_FOLDER [TEXT...] [--pair TEXT] [--no-special-tokens]   (text from "
         "stdin if none)\n"
         "  transmuter chat MODEL_OR_FOLDER --render [--tools FILE] [--add-generation-prompt] [--template "
         "NAME]\n"
         "                 (prints the chat template's prompt for a JSON array of messages on stdin)\n"
         "  transmuter embed MODEL [TEXT...] [--pooling MODE] [--normalize|--no-normalize]      (JSON lines: "
         "embedding)\n"
         "  transmuter classify MODEL [TEXT...] [--pair TEXT] [--top-k N] [--function softmax|sigmoid|none]\n"
         "  transmuter ner MODEL [TEXT...] [--aggregation none|simple|first|average|max] [--ignore LABEL]... "
         "[--no-ignore]\n"
         "  transmuter fill-mask MODEL [TEXT...] [--top-k N] [--target WORD]...\n"
         "  transmuter generate MODEL [PROMPT...] [--max-new-tokens N] [--min-new-tokens N] [--do-sample]\n"
         "                 [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--repetition-penalty R] "
         "[--no-repeat-ngram N] [--stop TEXT]...\n"
         "                 [--seed N] [--cache auto|none|dynamic|static] [--jsonl]   (streams to stdout, "
         "summary on stderr;\n"
         "                 decoder-only exports, or encoder-decoders: encoder_model + "
         "decoder_model[_merged].onnx;\n"
         "                 an encoder that takes no text: --input NAME=FILE.npy... [--decoder-prompt "
         "ID,ID,...])\n"
         "  transmuter chat MODEL [--system TEXT] [generation options]   (one user message per line of "
         "stdin)\n"
         "                 (text commands: a model folder with tokenizer.json, or hf://; texts from stdin if "
         "none;\n"
         "                  --mode eager|compiled --max-length N --reject-long --batch-size N --dtype D "
         "--model-file F)\n"
         "MODEL is a path or hf://org/repo[@revision][/path/in/repo.onnx] (with --dtype to pick the file).\n";
}

}  // namespace

// OpenBLAS (linked for MLX's remaining BLAS calls: docs/performance.md "BLAS") starts its server
// threads when the library loads, and each spins in sched_yield for ~2^28 cycles (~0.1 s) waiting
// for work, on the core the load's packing and then the kernels need: `transmuter info` on
// all-MiniLM-L6 used 176 ms of CPU for 123 ms, 105 ms for 97 with the threads stopped. Stopping
// them is what OpenBLAS does itself before a fork; its next parallel call starts them again.
// Weak: another BLAS has no such function.
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));

void stop_idle_blas_threads() {
  if (blas_thread_shutdown_ != nullptr) blas_thread_shutdown_();
}

int main(int argc, char** argv) {
  stop_idle_blas_threads();
  if (argc < 2) {
    usage();
    return 2;
  }
  std::string command = argv[1];
  try {
    Args args = parse_args(argc, argv, 2);
    if (command == "info") return info_main(args);
    if (command == "run") return run_main(args);
    if (command == "bench") return bench_main(args);
    if (command == "conformance") return cli::conformance_main(args);
    if (command == "operators") return operators_main();
    if (command == "download") return cli::download_main(args);
    if (command == "cache") return cli::cache_main(args);
    if (command == "tokenize") return cli::tokenize_main(args);
    if (command == "chat") return cli::chat_main(args);
    if (command == "embed") return cli::embed_main(args);
    if (command == "classify") return cli::classify_main(args);
    if (command == "ner") return cli::ner_main(args);
    if (command == "fill-mask") return cli::fill_mask_main(args);
    if (command == "generate") return cli::generate_main(args);
    usage();
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "transmuter " << command << ": error: " << e.what() << "\n";
    return 1;
  }
}
