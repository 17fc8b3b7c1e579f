// Loads a page in Debian's headless Chromium the way a user opens it: what the page reported
// (body data-status / data-charts set by its script, data-errors from window.onerror), every
// console line, and optionally a screenshot.
#pragma once

#include <cstdlib>
#include <string>

#include "keel_process.h"

namespace keel_test {

struct PageLoad {
  bool ran = false;      // Chromium started and printed a DOM
  std::string dom, log;  // --dump-dom output; Chromium's stderr (console lines: ":CONSOLE")
  std::string status, charts, errors;  // attributes the page set
};

inline bool HaveChromium() {
  return std::system("command -v chromium >/dev/null 2>&1") == 0;
}

inline std::string Attribute(const std::string& dom, const std::string& tag,
                             const std::string& name) {
  const size_t t = dom.find("<" + tag);
  if (t == std::string::npos) return "";
  const size_t end = dom.find('>', t);
  const size_t a = dom.find(name + "=\"", t);
  if (a == std::string::npos || a > end) return "";
  const size_t v = a + name.size() + 2;
  return dom.substr(v, dom.find('"', v) - v);
}

inline PageLoad LoadInChromium(const std::string& html, const std::string& work_dir,
                               const std::string& screenshot = "") {
  const std::string flags =
      "--headless --no-sandbox --disable-gpu --hide-scrollbars "
      "--no-first-run --user-data-dir=" +
      work_dir + "/chromium-profile ";
  PageLoad p;
  const std::string out = work_dir + "/dom.html", err = work_dir + "/chromium.log";
  const std::string cmd = "chromium " + flags + "--enable-logging=stderr --v=0 --dump-dom file://" +
                          html + " >" + out + " 2>" + err;
  p.ran = std::system(cmd.c_str()) == 0;
  p.dom = ReadText(out);
  p.log = ReadText(err);
  p.ran = p.ran && !p.dom.empty();
  p.status = Attribute(p.dom, "body", "data-status");
  p.charts = Attribute(p.dom, "body", "data-charts");
  p.errors = Attribute(p.dom, "html", "data-errors");
  if (!screenshot.empty()) {
    const std::string shot = "chromium " + flags +
                             "--window-size=1000,2600 --screenshot=" + screenshot + " file://" +
                             html + " >/dev/null 2>&1";
    if (std::system(shot.c_str()) != 0) p.ran = false;
  }
  return p;
}

// Console lines Chromium logged for the page (none expected: keel's page logs nothing).
inline std::string ConsoleLines(const std::string& log) {
  std::string lines;
  size_t pos = 0;
  while ((pos = log.find(":CONSOLE", pos)) != std::string::npos) {
    const size_t start = log.rfind('\n', pos) + 1, end = log.find('\n', pos);
    lines += log.substr(start, end - start) + "\n";
    pos = end;
  }
  return lines;
}

}  // namespace keel_test
