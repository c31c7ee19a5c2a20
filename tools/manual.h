// The documentation of the trafficrate command and library, kept once: the
// `--help` texts, `trafficrate help TOPIC` and the man pages trafficrate(1)
// and trafficrate(7) are all rendered from these tables, so they cannot
// drift apart.
//
//   std::fputs(CommandHelp(*FindCommandDoc("stat")).c_str(), stdout);
//   std::string roff = ManPage(7, "2026-12-04");
//
// Text markup, per paragraph (one string): plain text, filled; "* " starts a
// bullet; "= TERM: text" a definition (a term and its meaning); a paragraph
// whose every line starts with four blanks is shown verbatim. `code` spans
// are set in bold in the man pages and kept as `code` in --help.

#ifndef TRAFFICRATE_TOOLS_MANUAL_H_
#define TRAFFICRATE_TOOLS_MANUAL_H_

#include <string>
#include <vector>

namespace trafficrate {

// One option of a subcommand: "--zone NAME" and its meaning.
struct OptionDoc {
  const char* flag;  // "--zone"
  const char* arg;   // "NAME", or "" for a switch
  const char* text;
};

struct CommandDoc {
  const char* name;      // "stat"
  const char* summary;   // one line, for the command list
  const char* synopsis;  // what follows "trafficrate NAME"
  std::vector<const char*> paragraphs;
  std::vector<OptionDoc> options;
  std::vector<const char*> examples;  // command lines
};

// A section of trafficrate(7), also `trafficrate help TOPIC`.
struct TopicDoc {
  const char* topic;  // "rules"
  const char* title;  // "RULES FILE"
  std::vector<const char*> paragraphs;
};

const std::vector<CommandDoc>& CommandDocs();
const CommandDoc* FindCommandDoc(const std::string& name);
const std::vector<TopicDoc>& TopicDocs();
const TopicDoc* FindTopicDoc(const std::string& topic);

// `trafficrate --help`.
std::string OverviewHelp();
// `trafficrate COMMAND --help`.
std::string CommandHelp(const CommandDoc& command);
// `trafficrate help TOPIC`: the section as plain text.
std::string TopicHelp(const TopicDoc& topic);

// The man page of `section` (1: the command, 7: the library) in roff, dated
// `date` (YYYY-MM-DD); "" for another section.
std::string ManPage(int section, const std::string& date);

}  // namespace trafficrate

#endif  // TRAFFICRATE_TOOLS_MANUAL_H_
