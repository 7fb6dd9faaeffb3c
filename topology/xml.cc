#include "topology/xml.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <pugixml.hpp>
#include <sstream>

namespace loom::topology {
namespace {

// Turns byte offsets into 1-based line numbers for error messages.
class LineMap {
 public:
  explicit LineMap(const std::string& text) {
    for (size_t i = 0; i < text.size(); ++i)
      if (text[i] == '\n') newlines_.push_back(i);
  }
  int line(ptrdiff_t offset) const {
    if (offset < 0) return 0;
    auto it = std::lower_bound(newlines_.begin(), newlines_.end(), static_cast<size_t>(offset));
    return static_cast<int>(it - newlines_.begin()) + 1;
  }

 private:
  std::vector<size_t> newlines_;
};

class Parser {
 public:
  Parser(const std::string& text, std::string source) : lines_(text), source_(std::move(source)) {}

  Status error(const pugi::xml_node& node, const std::string& what) const {
    return errorf(Code::kInvalidArgument, "%s:%d: %s", source_.c_str(),
                  lines_.line(node.offset_debug()), what.c_str());
  }
  void warn(const pugi::xml_node& node, const std::string& what) {
    warnings_.push_back(source_ + ":" + std::to_string(lines_.line(node.offset_debug())) + ": " +
                        what);
  }
  std::vector<std::string>& warnings() { return warnings_; }

  // Integer attribute (decimal or 0x hex); `fallback` when absent.
  Result<int64_t> integer(const pugi::xml_node& node, const char* name, int64_t fallback) const {
    pugi::xml_attribute a = node.attribute(name);
    if (!a) return fallback;
    const char* s = a.value();
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(s, &end, 0);
    if (*s == '\0' || errno != 0 || *end != '\0') {
      return error(node, std::string("attribute ") + name + "=\"" + s + "\" of <" + node.name() +
                             "> is not an integer");
    }
    return static_cast<int64_t>(v);
  }
  Result<uint64_t> unsignedHex(const pugi::xml_node& node, const char* name) const {
    pugi::xml_attribute a = node.attribute(name);
    if (!a) return uint64_t{0};
    const char* s = a.value();
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(s, &end, 0);
    if (*s == '\0' || errno != 0 || *end != '\0') {
      return error(node, std::string("attribute ") + name + "=\"" + s + "\" of <" + node.name() +
                             "> is not a number");
    }
    return static_cast<uint64_t>(v);
  }
  Result<double> real(const pugi::xml_node& node, const char* name) const {
    pugi::xml_attribute a = node.attribute(name);
    if (!a) return 0.0;
    const char* s = a.value();
    char* end = nullptr;
    double v = std::strtod(s, &end);
    if (*s == '\0' || *end != '\0') {
      return error(node, std::string("attribute ") + name + "=\"" + s + "\" of <" + node.name() +
                             "> is not a number");
    }
    return v;
  }
  Result<std::string> busId(const pugi::xml_node& node, const char* name) const {
    pugi::xml_attribute a = node.attribute(name);
    if (!a) return error(node, std::string("<") + node.name() + "> has no " + name);
    auto r = normalizeBusId(a.value());
    if (!r) return error(node, r.status().message());
    return r.value();
  }
  // Everything but `known` goes to `extra`, in document order.
  static Attrs extras(const pugi::xml_node& node, std::initializer_list<const char*> known) {
    Attrs out;
    for (pugi::xml_attribute a : node.attributes()) {
      bool isKnown = std::any_of(known.begin(), known.end(),
                                 [&](const char* k) { return std::string(k) == a.name(); });
      if (!isKnown) out.emplace_back(a.name(), a.value());
    }
    return out;
  }

  Result<Net> net(const pugi::xml_node& node) {
    Net n;
    n.name = node.attribute("name").value();
    if (n.name.empty()) return error(node, "<net> has no name");
    LOOM_ASSIGN_OR_RETURN(int64_t dev, integer(node, "dev", -1));
    LOOM_ASSIGN_OR_RETURN(int64_t speed, integer(node, "speed", 0));
    LOOM_ASSIGN_OR_RETURN(int64_t port, integer(node, "port", 0));
    LOOM_ASSIGN_OR_RETURN(int64_t maxConn, integer(node, "maxconn", 0));
    LOOM_ASSIGN_OR_RETURN(int64_t gdr, integer(node, "gdr", 0));
    LOOM_ASSIGN_OR_RETURN(n.guid, unsignedHex(node, "guid"));
    LOOM_ASSIGN_OR_RETURN(n.latency, real(node, "latency"));
    if (speed < 0) return error(node, "negative net speed");
    n.dev = static_cast<int>(dev);
    n.speedMbps = static_cast<int>(speed);
    n.port = static_cast<int>(port);
    n.maxConn = static_cast<int>(maxConn);
    n.gdr = gdr != 0;
    n.extra = extras(node, {"name", "dev", "speed", "port", "maxconn", "gdr", "guid", "latency"});
    return n;
  }

  Result<Nic> nic(const pugi::xml_node& node) {
    Nic n;
    n.extra = extras(node, {});
    for (pugi::xml_node child : node.children()) {
      if (child.type() != pugi::node_element) continue;
      if (std::string(child.name()) == "net") {
        LOOM_ASSIGN_OR_RETURN(Net net, this->net(child));
        n.nets.push_back(std::move(net));
      } else {
        warn(child, std::string("skipping unknown element <") + child.name() + "> in <nic>");
      }
    }
    return n;
  }

  Result<Gpu> gpu(const pugi::xml_node& node) {
    Gpu g;
    LOOM_ASSIGN_OR_RETURN(int64_t dev, integer(node, "dev", -1));
    LOOM_ASSIGN_OR_RETURN(int64_t sm, integer(node, "sm", 0));
    LOOM_ASSIGN_OR_RETURN(int64_t rank, integer(node, "rank", -1));
    LOOM_ASSIGN_OR_RETURN(int64_t gdr, integer(node, "gdr", 0));
    g.dev = static_cast<int>(dev);
    g.sm = static_cast<int>(sm);
    g.rank = static_cast<int>(rank);
    g.gdr = gdr != 0;
    g.extra = extras(node, {"dev", "sm", "rank", "gdr", "no_p2p"});
    LOOM_ASSIGN_OR_RETURN(g.p2p, noP2p(node));
    for (pugi::xml_node child : node.children()) {
      if (child.type() != pugi::node_element) continue;
      if (std::string(child.name()) != "nvlink") {
        g.unknown.push_back(raw(child));
        continue;
      }
      NvLink link;
      LOOM_ASSIGN_OR_RETURN(link.target, busId(child, "target"));
      LOOM_ASSIGN_OR_RETURN(int64_t count, integer(child, "count", 1));
      if (count < 0) return error(child, "negative nvlink count");
      link.count = static_cast<int>(count);
      link.targetClass = child.attribute("tclass").value();
      link.extra = extras(child, {"target", "count", "tclass"});
      g.nvlinks.push_back(std::move(link));
    }
    return g;
  }

  // no_p2p="0000:43:00.0,0000:52:00.0": the peers CUDA gives no access to.
  Result<std::vector<P2pPeer>> noP2p(const pugi::xml_node& node) const {
    std::vector<P2pPeer> out;
    std::stringstream ss(node.attribute("no_p2p").value());
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty()) continue;
      auto bus = normalizeBusId(item);
      if (!bus) return error(node, "no_p2p: " + bus.status().message());
      out.push_back(P2pPeer{bus.value(), false, 0, false});
    }
    return out;
  }

  Result<PciNode> pci(const pugi::xml_node& node, int depth) {
    if (depth > 32) return error(node, "PCI tree deeper than 32 levels");
    PciNode p;
    LOOM_ASSIGN_OR_RETURN(p.busId, busId(node, "busid"));
    p.pciClass = node.attribute("class").value();
    p.vendor = node.attribute("vendor").value();
    p.device = node.attribute("device").value();
    p.subsystemVendor = node.attribute("subsystem_vendor").value();
    p.subsystemDevice = node.attribute("subsystem_device").value();
    p.linkSpeed = node.attribute("link_speed").value();
    LOOM_ASSIGN_OR_RETURN(int64_t width, integer(node, "link_width", 0));
    p.linkWidth = static_cast<int>(width);
    p.extra = extras(node, {"busid", "class", "vendor", "device", "subsystem_vendor",
                            "subsystem_device", "link_speed", "link_width"});
    for (pugi::xml_node child : node.children()) {
      if (child.type() != pugi::node_element) continue;
      std::string name = child.name();
      if (name == "pci") {
        LOOM_ASSIGN_OR_RETURN(PciNode c, pci(child, depth + 1));
        p.children.push_back(std::move(c));
      } else if (name == "gpu") {
        if (p.gpu) return error(child, "second <gpu> in one <pci>");
        LOOM_ASSIGN_OR_RETURN(p.gpu, gpu(child));
      } else if (name == "nic") {
        LOOM_ASSIGN_OR_RETURN(Nic n, nic(child));
        if (p.nic) {
          for (Net& net : n.nets) p.nic->nets.push_back(std::move(net));
        } else {
          p.nic = std::move(n);
        }
      } else {
        p.unknown.push_back(raw(child));
      }
    }
    return p;
  }

  Result<Cpu> cpu(const pugi::xml_node& node) {
    Cpu c;
    LOOM_ASSIGN_OR_RETURN(int64_t numa, integer(node, "numaid", -1));
    LOOM_ASSIGN_OR_RETURN(int64_t family, integer(node, "familyid", -1));
    LOOM_ASSIGN_OR_RETURN(int64_t model, integer(node, "modelid", -1));
    c.numaId = static_cast<int>(numa);
    c.familyId = static_cast<int>(family);
    c.modelId = static_cast<int>(model);
    c.affinity = node.attribute("affinity").value();
    c.arch = node.attribute("arch").value();
    c.vendor = node.attribute("vendor").value();
    c.extra = extras(node, {"numaid", "affinity", "arch", "vendor", "familyid", "modelid"});
    for (pugi::xml_node child : node.children()) {
      if (child.type() != pugi::node_element) continue;
      std::string name = child.name();
      if (name == "pci") {
        LOOM_ASSIGN_OR_RETURN(PciNode p, pci(child, 0));
        c.pcis.push_back(std::move(p));
      } else if (name == "nic") {
        LOOM_ASSIGN_OR_RETURN(Nic n, nic(child));
        c.nics.push_back(std::move(n));
      } else {
        c.unknown.push_back(raw(child));
      }
    }
    return c;
  }

  Result<System> system(const pugi::xml_node& node) {
    System s;
    LOOM_ASSIGN_OR_RETURN(int64_t version, integer(node, "version", 1));
    s.version = static_cast<int>(version);
    s.extra = extras(node, {"version"});
    for (pugi::xml_node child : node.children()) {
      if (child.type() != pugi::node_element) continue;
      if (std::string(child.name()) == "cpu") {
        LOOM_ASSIGN_OR_RETURN(Cpu c, cpu(child));
        s.cpus.push_back(std::move(c));
      } else {
        warn(child, std::string("skipping unknown element <") + child.name() + "> in <system>");
      }
    }
    return s;
  }

  int line(ptrdiff_t offset) const { return lines_.line(offset); }

  // An element loom does not interpret, kept as text so it is written back unchanged.
  static std::string raw(const pugi::xml_node& node) {
    std::ostringstream out;
    node.print(out, "", pugi::format_raw);
    return out.str();
  }

 private:
  LineMap lines_;
  std::string source_;
  std::vector<std::string> warnings_;
};

// --- writing ---

void setIf(pugi::xml_node& node, const char* name, const std::string& value) {
  if (!value.empty()) node.append_attribute(name).set_value(value.c_str());
}
void setInt(pugi::xml_node& node, const char* name, long long value) {
  node.append_attribute(name).set_value(std::to_string(value).c_str());
}
void setExtras(pugi::xml_node& node, const Attrs& extra) {
  for (const auto& [k, v] : extra) node.append_attribute(k.c_str()).set_value(v.c_str());
}

void writeUnknown(pugi::xml_node parent, const std::vector<std::string>& unknown) {
  for (const std::string& text : unknown) {
    pugi::xml_document doc;
    if (doc.load_string(text.c_str())) parent.append_copy(doc.document_element());
  }
}

void writeNic(pugi::xml_node parent, const Nic& nic) {
  pugi::xml_node n = parent.append_child("nic");
  setExtras(n, nic.extra);
  for (const Net& net : nic.nets) {
    pugi::xml_node e = n.append_child("net");
    e.append_attribute("name").set_value(net.name.c_str());
    setInt(e, "dev", net.dev);
    setInt(e, "speed", net.speedMbps);
    setInt(e, "port", net.port);
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%f", net.latency);
    e.append_attribute("latency").set_value(buf);
    std::snprintf(buf, sizeof(buf), "0x%" PRIx64, net.guid);
    e.append_attribute("guid").set_value(buf);
    setInt(e, "maxconn", net.maxConn);
    setInt(e, "gdr", net.gdr ? 1 : 0);
    setExtras(e, net.extra);
  }
}

void writePci(pugi::xml_node parent, const PciNode& pci) {
  pugi::xml_node p = parent.append_child("pci");
  p.append_attribute("busid").set_value(pci.busId.c_str());
  setIf(p, "class", pci.pciClass);
  setIf(p, "vendor", pci.vendor);
  setIf(p, "device", pci.device);
  setIf(p, "subsystem_vendor", pci.subsystemVendor);
  setIf(p, "subsystem_device", pci.subsystemDevice);
  setIf(p, "link_speed", pci.linkSpeed);
  if (pci.linkWidth > 0) setInt(p, "link_width", pci.linkWidth);
  setExtras(p, pci.extra);
  for (const PciNode& child : pci.children) writePci(p, child);
  if (pci.gpu) {
    const Gpu& gpu = *pci.gpu;
    pugi::xml_node g = p.append_child("gpu");
    setInt(g, "dev", gpu.dev);
    setInt(g, "sm", gpu.sm);
    setInt(g, "rank", gpu.rank);
    setInt(g, "gdr", gpu.gdr ? 1 : 0);
    std::string denied;
    for (const P2pPeer& peer : gpu.p2p)
      if (!peer.access) denied += (denied.empty() ? "" : ",") + peer.target;
    setIf(g, "no_p2p", denied);
    setExtras(g, gpu.extra);
    for (const NvLink& link : gpu.nvlinks) {
      pugi::xml_node l = g.append_child("nvlink");
      l.append_attribute("target").set_value(link.target.c_str());
      setInt(l, "count", link.count);
      setIf(l, "tclass", link.targetClass);
      setExtras(l, link.extra);
    }
    writeUnknown(g, gpu.unknown);
  }
  if (pci.nic) writeNic(p, *pci.nic);
  writeUnknown(p, pci.unknown);
}

}  // namespace

Result<XmlReadResult> parseXml(const std::string& text, const std::string& source) {
  pugi::xml_document doc;
  pugi::xml_parse_result parsed = doc.load_buffer(text.data(), text.size(), pugi::parse_default);
  Parser parser(text, source);
  if (!parsed) {
    return errorf(Code::kInvalidArgument, "%s:%d: malformed XML: %s", source.c_str(),
                  parser.line(parsed.offset), parsed.description());
  }
  pugi::xml_node root = doc.document_element();
  if (!root || std::string(root.name()) != "system") {
    return errorf(Code::kInvalidArgument, "%s:%d: the root element is <%s>, expected <system>",
                  source.c_str(), root ? parser.line(root.offset_debug()) : 1,
                  root ? root.name() : "");
  }
  LOOM_ASSIGN_OR_RETURN(System system, parser.system(root));
  XmlReadResult out;
  out.system = std::move(system);
  out.warnings = std::move(parser.warnings());
  return out;
}

Result<XmlReadResult> readXmlFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return sysError(errno, "cannot open topology file %s", path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  return parseXml(ss.str(), path);
}

std::string toXml(const System& system) {
  pugi::xml_document doc;
  pugi::xml_node s = doc.append_child("system");
  setInt(s, "version", system.version);
  setExtras(s, system.extra);
  for (const Cpu& cpu : system.cpus) {
    pugi::xml_node c = s.append_child("cpu");
    setInt(c, "numaid", cpu.numaId);
    setIf(c, "affinity", cpu.affinity);
    setIf(c, "arch", cpu.arch);
    setIf(c, "vendor", cpu.vendor);
    if (cpu.familyId >= 0) setInt(c, "familyid", cpu.familyId);
    if (cpu.modelId >= 0) setInt(c, "modelid", cpu.modelId);
    setExtras(c, cpu.extra);
    for (const PciNode& pci : cpu.pcis) writePci(c, pci);
    for (const Nic& nic : cpu.nics) writeNic(c, nic);
    writeUnknown(c, cpu.unknown);
  }
  std::ostringstream out;
  doc.save(out, "  ", pugi::format_indent | pugi::format_no_declaration);
  return out.str();
}

Status writeXmlFile(const System& system, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return sysError(errno, "cannot write topology file %s", path.c_str());
  out << toXml(system);
  out.flush();
  if (!out) return sysError(errno, "writing topology file %s", path.c_str());
  return Status::ok();
}

}  // namespace loom::topology
