// A run's metrics.jsonl as the tests read it: its records, those of one type, the step losses.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdpq::test {

// Every record of a JSON-lines file, in order (blank lines skipped).
inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// The records whose "type" is `type`.
inline std::vector<nlohmann::json> of_type(const std::vector<nlohmann::json>& lines, const std::string& type) {
  std::vector<nlohmann::json> out;
  for (const auto& l : lines)
    if (l.at("type") == type) out.push_back(l);
  return out;
}

// The loss of each "step" record of the run in `run_dir`, in the order logged.
inline std::vector<double> step_losses(const std::filesystem::path& run_dir) {
  std::vector<double> losses;
  for (const auto& s : of_type(read_jsonl(run_dir / "metrics.jsonl"), "step")) losses.push_back(s.at("loss").get<double>());
  return losses;
}

}  // namespace fsdpq::test
