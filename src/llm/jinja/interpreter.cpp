#include "interpreter.hpp"

#include <algorithm>
#include <iterator>
#include <string_view>

#include "builtins.hpp"
#include "operators.hpp"
#include "xmoe/error.hpp"

namespace xmoe::jinja {
namespace {

struct Frame {
  std::shared_ptr<Frame> parent;
  Dict vars;
  // A macro defined here holds the frame weakly: a loop may then not reuse it for the next iteration.
  bool captured = false;
  const Value* find(const std::string& name) const {
    for (const Frame* f = this; f; f = f->parent.get())
      if (const Value* v = f->vars.find(name)) return v;
    return nullptr;
  }
};
using FramePtr = std::shared_ptr<Frame>;

enum class Flow { Normal, Break, Continue };

// Deep recursion (a macro calling itself forever) must end in an error, not a stack overflow.
constexpr int kMaxCallDepth = 200;
// A template comes with a downloaded checkpoint, so one render must end, and soon (about a second at worst
// under AddressSanitizer): statements, loop iterations and expression evaluations share this budget, far
// above what chat templates use on long conversations (~1e4 to 1e5). Work on data counts by its size, so the
// bound is on work done, however cheap an operation looks: scanning, copying or building kWeightPerOperation
// bytes of a value (Value::weight) is one more operation, and a for loop pays for the items it materialises
// before it makes them. The rendered text is capped like any string value (kMaxStringBytes).
constexpr int64_t kMaxOperations = 1'000'000;
constexpr uint64_t kWeightPerOperation = 64;
// A call (function, method, filter) builds its argument list and a result value, and a non-string printed is
// rendered through repr: counted as one step each, templates of cheap string-method calls and printed lists
// reached 1.33 s under ASan at the budget (found by fuzz_jinja_template).
constexpr uint64_t kCallOperations = 4;
// Filters whose work does not grow with what the value holds (a list's items are copied, not walked), so they
// are charged the value's own size, not its nested contents: `messages|length` in a loop over the messages
// must not make a long conversation quadratic.
constexpr std::string_view kShallowFilters[] = {"length", "count", "first", "last", "default",
                                                "d",      "safe",  "list",  "items"};

class Interpreter {
 public:
  explicit Interpreter(const Program& program) : program_(program) {}

  std::string run(const Value& context, const std::optional<std::tm>& now) {
    // Empties every namespace on the way out, however rendering ends (see make_globals).
    struct NamespaceReaper {
      std::vector<std::shared_ptr<Dict>> made;
      ~NamespaceReaper() {
        for (auto& ns : made) ns->items.clear();
      }
    } namespaces;
    auto globals = std::make_shared<Frame>();
    globals->vars = make_globals(now, namespaces.made);
    for (const auto& [k, v] : context.dict->items) globals->vars.set(k, v);
    auto top = std::make_shared<Frame>();
    top->parent = globals;
    std::string out;
    try {
      exec_body(program_.body, top, out);
    } catch (const TemplateFailure& f) {
      throw Error(detail::concat("chat template '", program_.name, "', line ", f.line, ": ", f.kind, ": ",
                                 f.message));
    }
    return out;
  }

 private:
  static void mark_line(TemplateFailure& f, int line) {
    if (f.line == 0) f.line = line;
  }

  Flow exec_body(const Body& body, const FramePtr& frame, std::string& out) {
    for (const auto& stmt : body) {
      Flow flow;
      try {
        flow = exec(*stmt, frame, out);
      } catch (TemplateFailure& f) {
        mark_line(f, stmt->line);
        throw;
      }
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

  void tick() { count_operations(1); }

  // Work on `weight` bytes of values (see kWeightPerOperation).
  void charge(uint64_t weight) { count_operations(weight / kWeightPerOperation); }

  void count_operations(uint64_t n) {
    if (n > static_cast<uint64_t>(kMaxOperations - operations_))
      fail("ResourceError", "the template ran over " + std::to_string(kMaxOperations) +
                                " operations (statements, loop iterations, expressions, work on data) in one "
                                "render");
    operations_ += static_cast<int64_t>(n);
  }

  void append(std::string& out, const std::string& text) {
    charge(text.size());
    if (out.size() + text.size() > kMaxStringBytes)
      fail("MemoryError", "the rendered text would exceed " + std::to_string(kMaxStringBytes) + " bytes");
    out += text;
  }

  Flow exec(const Stmt& s, const FramePtr& frame, std::string& out) {
    tick();
    switch (s.type) {
      case Stmt::Type::Text:
        append(out, s.text);
        return Flow::Normal;
      case Stmt::Type::Print: {
        const Value value = eval(*s.expr, frame);
        // Before printing: a list's text is as long as all it holds (a string is charged as it is appended).
        if (value.is_string()) {
          append(out, value.s());  // not through to_str, which returns a copy
        } else {
          count_operations(kCallOperations);
          charge(value.weight);
          append(out, to_str(value));
        }
        return Flow::Normal;
      }
      case Stmt::Type::If:
        for (size_t i = 0; i < s.conditions.size(); ++i)
          if (truthy(eval(*s.conditions[i], frame))) return exec_body(s.bodies[i], frame, out);
        return exec_body(s.else_body, frame, out);
      case Stmt::Type::For:
        return exec_for(s, frame, out);
      case Stmt::Type::Set:
        exec_set(s, frame);
        return Flow::Normal;
      case Stmt::Type::Macro:
        frame->vars.set(s.text, make_macro(s, frame));
        return Flow::Normal;
      case Stmt::Type::Break:
        return Flow::Break;
      case Stmt::Type::Continue:
        return Flow::Continue;
      case Stmt::Type::Generation:
        return exec_body(s.body, frame, out);
    }
    return Flow::Normal;
  }

  void exec_set(const Stmt& s, const FramePtr& frame) {
    Value value;
    if (s.block_set) {
      std::string captured;
      exec_body(s.body, frame, captured);
      value = Value::from_string(std::move(captured));  // plain str: autoescape is off
    } else {
      value = eval(*s.expr, frame);
    }
    if (s.attr.empty()) {
      frame->vars.set(s.targets[0], std::move(value));
      return;
    }
    const Value* target = frame->find(s.targets[0]);
    if (!target || target->kind != Kind::Namespace)
      fail("TemplateRuntimeError", "cannot assign attribute on non-namespace object");
    if (s.attr[0] == '_')
      fail("SecurityError",
           "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + s.attr +
               "'. Please rename the attribute.");
    target->ns->set(s.attr, std::move(value));
  }

  Flow exec_for(const Stmt& s, const FramePtr& frame, std::string& out) {
    const Value iterable = eval(*s.expr, frame);
    // Paid before the items are made, as a loop that breaks at once has still made them all: a list's items
    // are copied; a string's characters (at most its bytes) are each a new string, an operation apiece.
    charge(iterable.is_string() ? iterable.s().size() * kWeightPerOperation : shallow_weight(iterable));
    List items = iterate(iterable);
    auto bind = [&](const FramePtr& f, const Value& item) {
      if (s.targets.size() == 1) {
        f->vars.set(s.targets[0], item);
        return;
      }
      const List parts = iterate(item);
      if (parts.size() != s.targets.size())
        fail("ValueError",
             parts.size() > s.targets.size()
                 ? "too many values to unpack (expected " + std::to_string(s.targets.size()) + ")"
                 : "not enough values to unpack (expected " + std::to_string(s.targets.size()) + ", got " +
                       std::to_string(parts.size()) + ")");
      for (size_t i = 0; i < parts.size(); ++i) f->vars.set(s.targets[i], parts[i]);
    };
    if (s.filter) {
      List kept;
      for (const Value& item : items) {
        auto f = std::make_shared<Frame>();
        f->parent = frame;
        bind(f, item);
        if (truthy(eval(*s.filter, f))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec_body(s.else_body, frame, out);
    const auto n = static_cast<int64_t>(items.size());
    // Made once per loop, not per iteration (allocations are most of an iteration's cost). loop.cycle reads
    // the current index like jinja2's LoopContext.cycle, so one function serves every iteration.
    const Value no_previous = Value::undefined("there is no previous item");
    const Value no_next = Value::undefined("there is no next item");
    const auto index = std::make_shared<int64_t>(0);
    const Value cycle = Value::from_callable("cycle", [index](CallArgs& a) {
      if (a.positional.empty()) fail("TypeError", "no items for cycling given");
      return a.positional[static_cast<size_t>(*index) % a.positional.size()];
    });
    // Each iteration builds the loop object, a dict of kLoopEntries entries, paid like any dict a template
    // builds: counted as one step, nested loops with cheap bodies took about a second under ASan at the
    // budget (found by fuzz_jinja_template).
    constexpr uint64_t kLoopEntries = 12;
    // The iteration's frame and loop dict are reused for the next one when nothing else holds them (the
    // body did not store `loop` or define a macro there): allocations were most of an iteration's cost.
    // What a template sees is the same as with new ones: the frame is cut back to the loop variables.
    FramePtr f;
    size_t bound = 0;  // entries of a reused frame's vars: `loop` and the loop variables
    std::shared_ptr<Dict> loop;
    for (int64_t i = 0; i < n; ++i) {
      count_operations(1 + kLoopEntries * kItemWeight / kWeightPerOperation);
      *index = i;
      const bool reuse = f && f.use_count() == 1 && !f->captured;
      if (reuse) {
        f->vars.items.erase(f->vars.items.begin() + static_cast<std::ptrdiff_t>(bound), f->vars.items.end());
        f->vars.items[0].second = Value();  // drops its hold on the previous loop dict
      } else {
        f = std::make_shared<Frame>();
        f->parent = frame;
        f->vars.items.reserve(1 + s.targets.size());
        f->vars.items.emplace_back("loop", Value());
      }
      const Value& previous = i > 0 ? items[static_cast<size_t>(i - 1)] : no_previous;
      const Value& next = i + 1 < n ? items[static_cast<size_t>(i + 1)] : no_next;
      if (loop && loop.use_count() == 1) {
        auto& e = loop->items;
        e[0].second = Value::from_int(i + 1);
        e[1].second = Value::from_int(i);
        e[2].second = Value::from_int(n - i);
        e[3].second = Value::from_int(n - i - 1);
        e[4].second = Value::from_bool(i == 0);
        e[5].second = Value::from_bool(i == n - 1);
        e[9].second = previous;
        e[10].second = next;
      } else {
        // The keys are distinct, so they are appended without Dict::set's search.
        loop = std::make_shared<Dict>();
        auto& e = loop->items;
        e.reserve(kLoopEntries);
        e.emplace_back("index", Value::from_int(i + 1));
        e.emplace_back("index0", Value::from_int(i));
        e.emplace_back("revindex", Value::from_int(n - i));
        e.emplace_back("revindex0", Value::from_int(n - i - 1));
        e.emplace_back("first", Value::from_bool(i == 0));
        e.emplace_back("last", Value::from_bool(i == n - 1));
        e.emplace_back("length", Value::from_int(n));
        e.emplace_back("depth", Value::from_int(1));
        e.emplace_back("depth0", Value::from_int(0));
        e.emplace_back("previtem", previous);
        e.emplace_back("nextitem", next);
        e.emplace_back("cycle", cycle);
      }
      f->vars.items[0].second = Value::from_shared_dict(loop);
      bind(f, items[static_cast<size_t>(i)]);
      if (!reuse) bound = f->vars.items.size();
      if (exec_body(s.body, f, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value make_macro(const Stmt& s, const FramePtr& defining) {
    const Stmt* macro = &s;
    std::weak_ptr<Frame> weak = defining;  // the frame owns the macro; a strong link would be a cycle
    defining->captured = true;
    return Value::from_callable(s.text, [this, macro, weak](CallArgs& a) {
      const FramePtr parent = weak.lock();
      if (!parent) fail("TemplateRuntimeError", "macro '" + macro->text + "' called outside its scope");
      if (a.positional.size() > macro->params.size())
        fail("TypeError", "macro '" + macro->text + "' takes not more than " +
                              std::to_string(macro->params.size()) + " argument(s)");
      auto f = std::make_shared<Frame>();
      f->parent = parent;
      for (size_t i = 0; i < macro->params.size(); ++i) {
        const std::string& p = macro->params[i];
        const Value* given = i < a.positional.size() ? &a.positional[i] : nullptr;
        for (const auto& [k, v] : a.keyword)
          if (k == p) {
            if (given)
              fail("TypeError", "macro '" + macro->text + "' got multiple values for argument '" + p + "'");
            given = &v;
          }
        if (given)
          f->vars.set(p, *given);
        else if (macro->defaults[i])
          f->vars.set(p, eval(*macro->defaults[i], f));
        else
          f->vars.set(p, Value::undefined("parameter '" + p + "' was not provided"));
      }
      for (const auto& [k, v] : a.keyword)
        if (std::find(macro->params.begin(), macro->params.end(), k) == macro->params.end())
          fail("TypeError", "macro '" + macro->text + "' takes no keyword argument '" + k + "'");
      if (++depth_ > kMaxCallDepth) fail("RecursionError", "maximum macro recursion depth exceeded");
      std::string out;
      try {
        exec_body(macro->body, f, out);
      } catch (...) {
        --depth_;
        throw;
      }
      --depth_;
      return Value::from_string(std::move(out));  // plain str, not Markup: autoescape is off
    });
  }

  // A dict or namespace is searched key by key (Dict::find); a list or string is indexed directly.
  void charge_lookup(const Value& target) {
    if (target.kind == Kind::Dict || target.kind == Kind::Namespace) charge(shallow_weight(target));
  }

  // What a callee may walk: its arguments whole (macros, globals and methods alike).
  void charge_arguments(const CallArgs& args) {
    for (const Value& v : args.positional) charge(v.weight);
    for (const auto& [k, v] : args.keyword) charge(v.weight);
  }

  // A value an operation made: building it cost its own size (its items, not what they share).
  Value charged_result(Value v) {
    charge(shallow_weight(v));
    return v;
  }

  CallArgs eval_args(const Expr& e, const FramePtr& frame, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i], frame));
    for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, eval(*v, frame));
    return args;
  }

  static std::optional<int64_t> slice_index(const Value& v) {
    if (v.kind == Kind::None) return std::nullopt;
    if (v.kind == Kind::Int) return v.integer;
    if (v.kind == Kind::Bool) return v.boolean;
    if (v.is_undefined()) v.raise_undefined();
    fail("TypeError", "slice indices must be integers or None or have an __index__ method");
  }

  Value eval(const Expr& e, const FramePtr& frame) {
    try {
      tick();
      return eval_inner(e, frame);
    } catch (TemplateFailure& f) {
      mark_line(f, e.line);
      throw;
    }
  }

  Value eval_inner(const Expr& e, const FramePtr& frame) {
    switch (e.type) {
      case Expr::Type::Literal:
        return e.value;
      case Expr::Type::Name: {
        if (const Value* v = frame->find(e.name)) return *v;
        return e.value;  // the Undefined the parser made for this name
      }
      case Expr::Type::Attr: {
        const Value target = eval(*e.args[0], frame);
        charge_lookup(target);
        Value attribute = get_attribute(target, e.name);
        // A bound method (str.split, list.index, dict.items, ...) walks the value it is bound to.
        if (attribute.kind == Kind::Callable) charge(target.weight);
        return attribute;
      }
      case Expr::Type::Item: {
        const Value target = eval(*e.args[0], frame);
        const Value key = eval(*e.args[1], frame);
        charge_lookup(target);
        return get_item(target, key);
      }
      case Expr::Type::Slice: {
        const Value target = eval(*e.args[0], frame);
        std::optional<int64_t> parts[3];
        for (int i = 0; i < 3; ++i)
          if (e.args[i + 1]) parts[i] = slice_index(eval(*e.args[i + 1], frame));
        return charged_result(slice(target, parts[0], parts[1], parts[2]));
      }
      case Expr::Type::Call: {
        const Value callee = eval(*e.args[0], frame);
        CallArgs args = eval_args(e, frame, 1);
        if (callee.is_undefined()) callee.raise_undefined();
        if (callee.kind != Kind::Callable)
          fail("TypeError", "'" + type_name(callee) + "' object is not callable");
        count_operations(kCallOperations);
        charge_arguments(args);
        return charged_result(callee.fn->call(args));
      }
      case Expr::Type::Filter: {
        const Value target = eval(*e.args[0], frame);
        CallArgs args = eval_args(e, frame, 1);
        const bool shallow = std::find(std::begin(kShallowFilters), std::end(kShallowFilters), e.name) !=
                             std::end(kShallowFilters);
        count_operations(kCallOperations);
        charge(shallow ? shallow_weight(target) : target.weight);
        charge_arguments(args);
        return charged_result(apply_filter(e.name, target, args));
      }
      case Expr::Type::Test: {
        const Value target = eval(*e.args[0], frame);
        CallArgs args = eval_args(e, frame, 1);
        // Tests without arguments look at the kind of value only; the others (in, eq, lt, ...) compare.
        if (!args.positional.empty() || !args.keyword.empty()) {
          charge(target.weight);
          charge_arguments(args);
        }
        return Value::from_bool(apply_test(e.name, target, args) != e.negated);
      }
      case Expr::Type::Neg:
      case Expr::Type::Pos:
        return negate(eval(*e.args[0], frame), e.type == Expr::Type::Neg);
      case Expr::Type::Not:
        return Value::from_bool(!truthy(eval(*e.args[0], frame)));
      case Expr::Type::And: {
        Value left = eval(*e.args[0], frame);
        return truthy(left) ? eval(*e.args[1], frame) : left;
      }
      case Expr::Type::Or: {
        Value left = eval(*e.args[0], frame);
        return truthy(left) ? left : eval(*e.args[1], frame);
      }
      case Expr::Type::Binary: {
        // Python evaluates left to right (macros called in operands may have side effects).
        const Value left = eval(*e.args[0], frame);
        const Value right = eval(*e.args[1], frame);
        // `~` prints both sides whole; the others copy at most the operands themselves (list + list).
        if (e.name == "~") {
          charge(left.weight);
          charge(right.weight);
        } else {
          charge(shallow_weight(left));
          charge(shallow_weight(right));
        }
        const Expr& l = *e.args[0];
        if (e.name == "**" && l.type == Expr::Type::Literal && l.negated &&
            e.args[1]->type != Expr::Type::Literal)
          return negate(binary_op("**", negate(left, true), right), true);  // see fold_negative_literal
        return charged_result(binary_op(e.name, left, right));
      }
      case Expr::Type::Compare: {
        Value left = eval(*e.args[0], frame);
        charge(left.weight);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], frame);
          charge(right.weight);  // ==, in, < walk both sides whole
          if (!compare(e.ops[i], left, right)) return Value::from_bool(false);
          left = std::move(right);
        }
        return Value::from_bool(true);
      }
      case Expr::Type::CondExpr:
        if (truthy(eval(*e.args[0], frame))) return eval(*e.args[1], frame);
        if (e.args[2]) return eval(*e.args[2], frame);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
      case Expr::Type::List:
      case Expr::Type::Tuple: {
        List items;
        for (const auto& item : e.args) items.push_back(eval(*item, frame));
        return e.type == Expr::Type::Tuple ? Value::from_tuple(std::move(items))
                                           : Value::from_list(std::move(items));
      }
      case Expr::Type::Dict: {
        Dict d;
        for (size_t i = 0; i < e.args.size(); ++i) {
          const Value key = eval(*e.args[i], frame);
          if (key.kind != Kind::String)
            fail("TypeError", "dict literal keys must be strings in chat templates, got " + type_name(key));
          d.set(key.s(), eval(*e.values[i], frame));
        }
        return Value::from_dict(std::move(d));
      }
    }
    fail("TemplateRuntimeError", "unknown expression");
  }

  const Program& program_;
  int depth_ = 0;
  int64_t operations_ = 0;
};

}  // namespace

std::string render_program(const Program& program, const Value& context, const std::optional<std::tm>& now) {
  return Interpreter(program).run(context, now);
}

}  // namespace xmoe::jinja
