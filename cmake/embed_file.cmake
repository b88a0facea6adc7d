# Turns a file into a C source holding it as a NUL-terminated byte array:
#   cmake -DIN=page.html -DOUT=page.c -DNAME=qd_chat_html -P embed_file.cmake
# defines `const unsigned char NAME[]` and `const unsigned long NAME_len` (bytes, without the NUL).
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" body "${body}")
file(WRITE "${OUT}.tmp" "/* generated from ${IN} by cmake/embed_file.cmake */\nconst unsigned char ${NAME}[] = {\n${body}0x00};\nconst unsigned long ${NAME}_len = ${bytes};\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
