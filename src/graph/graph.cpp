#include "graph/graph.h"

#include "transmuter/error.h"

namespace transmuter {

const Attribute* Node::find_attribute(const std::string& attr_name) const {
  for (const Attribute& a : attributes) {
    if (a.name == attr_name) return &a;
  }
  return nullptr;
}

std::string Node::label() const {
  return str(op_type, " node '", name, "' (opset ", opset, ")");
}

}  // namespace transmuter
