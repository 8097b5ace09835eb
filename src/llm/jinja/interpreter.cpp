#include "interpreter.hpp"

#include "builtins.hpp"
#include "operators.hpp"
#include "xmoe/error.hpp"

namespace xmoe::jinja {
namespace {

struct Frame {
  std::shared_ptr<Frame> parent;
  Dict vars;
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
// A template comes with a downloaded checkpoint, so one render must end: statements, loop iterations and
// expression evaluations share this budget, far above what chat templates use on long conversations (~1e4
// to 1e5), and the rendered text is capped like any string value (kMaxStringBytes).
constexpr int64_t kMaxOperations = 1'000'000;

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

  void tick() {
    if (++operations_ > kMaxOperations)
      fail("ResourceError", "the template ran over " + std::to_string(kMaxOperations) +
                                " operations (statements, loop iterations, expressions) in one render");
  }

  static void append(std::string& out, const std::string& text) {
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
      case Stmt::Type::Print:
        append(out, to_str(eval(*s.expr, frame)));
        return Flow::Normal;
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
    for (int64_t i = 0; i < n; ++i) {
      tick();
      auto f = std::make_shared<Frame>();
      f->parent = frame;
      Dict loop;
      loop.set("index", Value::from_int(i + 1));
      loop.set("index0", Value::from_int(i));
      loop.set("revindex", Value::from_int(n - i));
      loop.set("revindex0", Value::from_int(n - i - 1));
      loop.set("first", Value::from_bool(i == 0));
      loop.set("last", Value::from_bool(i == n - 1));
      loop.set("length", Value::from_int(n));
      loop.set("depth", Value::from_int(1));
      loop.set("depth0", Value::from_int(0));
      loop.set("previtem",
               i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item"));
      loop.set("nextitem",
               i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item"));
      loop.set("cycle", Value::from_callable("cycle", [i](CallArgs& a) {
                 if (a.positional.empty()) fail("TypeError", "no items for cycling given");
                 return a.positional[static_cast<size_t>(i) % a.positional.size()];
               }));
      f->vars.set("loop", Value::from_dict(std::move(loop)));
      bind(f, items[static_cast<size_t>(i)]);
      if (exec_body(s.body, f, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value make_macro(const Stmt& s, const FramePtr& defining) {
    const Stmt* macro = &s;
    std::weak_ptr<Frame> weak = defining;  // the frame owns the macro; a strong link would be a cycle
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
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Type::Attr:
        return get_attribute(eval(*e.args[0], frame), e.name);
      case Expr::Type::Item: {
        const Value target = eval(*e.args[0], frame);
        return get_item(target, eval(*e.args[1], frame));
      }
      case Expr::Type::Slice: {
        const Value target = eval(*e.args[0], frame);
        std::optional<int64_t> parts[3];
        for (int i = 0; i < 3; ++i)
          if (e.args[i + 1]) parts[i] = slice_index(eval(*e.args[i + 1], frame));
        return slice(target, parts[0], parts[1], parts[2]);
      }
      case Expr::Type::Call: {
        const Value callee = eval(*e.args[0], frame);
        CallArgs args = eval_args(e, frame, 1);
        if (callee.is_undefined()) callee.raise_undefined();
        if (callee.kind != Kind::Callable)
          fail("TypeError", "'" + type_name(callee) + "' object is not callable");
        return callee.fn->call(args);
      }
      case Expr::Type::Filter: {
        const Value target = eval(*e.args[0], frame);
        CallArgs args = eval_args(e, frame, 1);
        return apply_filter(e.name, target, args);
      }
      case Expr::Type::Test: {
        const Value target = eval(*e.args[0], frame);
        CallArgs args = eval_args(e, frame, 1);
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
        const Expr& l = *e.args[0];
        if (e.name == "**" && l.type == Expr::Type::Literal && l.negated &&
            e.args[1]->type != Expr::Type::Literal)
          return negate(binary_op("**", negate(left, true), right), true);  // see fold_negative_literal
        return binary_op(e.name, left, right);
      }
      case Expr::Type::Compare: {
        Value left = eval(*e.args[0], frame);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], frame);
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
