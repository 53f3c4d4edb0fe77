// MLX primitives whose CPU evaluation only points the output at the input's buffer, with other strides or
// an offset, on the calling thread: they need no scheduler (runtime/direct_run.h, runtime/evaluate_here.h).
#pragma once

#include <set>
#include <string_view>

namespace transmuter {

/** A Reshape, and a View (the bytes as another type: "View float32"), share the input's buffer only when it
 * is row-contiguous; otherwise MLX copies it on the stream. Their input is made row-contiguous first. */
inline bool needs_contiguous_input(std::string_view name) {
  return name == "Reshape" || name.starts_with("View ");
}

inline bool is_view(std::string_view name) {
  static const std::set<std::string_view> views = {"Transpose", "Broadcast", "BroadcastAxes", "ExpandDims",
                                                   "Squeeze",   "Slice",     "Copy",          "StopGradient"};
  return views.count(name) > 0 || needs_contiguous_input(name);
}

}  // namespace transmuter
