// The text of the manual: the commands, the topics of trafficrate(7) and
// the overview, as tables (the variables' text is the configuration's own
// table, Variables() in src/config/config.h). tools/manual.cc renders them
// as --help, `trafficrate help TOPIC` and the man pages.

#ifndef TRAFFICRATE_TOOLS_MANUAL_TEXT_H_
#define TRAFFICRATE_TOOLS_MANUAL_TEXT_H_

#include <vector>

#include "tools/manual.h"

namespace trafficrate {

// The one-line summary (NAME in the man pages).
extern const char kSummary[];
// What `trafficrate --help` and DESCRIPTION in trafficrate(1) say first.
const std::vector<const char*>& OverviewParagraphs();
// Made once, never freed.
std::vector<CommandDoc>* MakeCommandDocs();
std::vector<TopicDoc>* MakeTopicDocs();

}  // namespace trafficrate

#endif  // TRAFFICRATE_TOOLS_MANUAL_TEXT_H_
